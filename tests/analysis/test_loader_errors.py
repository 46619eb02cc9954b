"""Bad input: one InputError naming the file and the problem, and nothing else, whatever the bytes."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepscope.analysis.read.loader import load_trace
from stepscope.analysis.read.table import TraceTable
from stepscope.cli import main
from stepscope.errors import InputError

from ..support.traces import ARG_KEYS, cpu, kernel, step, trace, write

GOOD = trace([step(1, 0, 100), cpu("aten::mm", 1, 10, **{"External id": 1}), kernel("k", 5, 3, corr=1)])
T0 = 1712195495519689.047  # epoch microseconds with a ns fraction: the loader reads `ts` as text
GOOD_EPOCH = trace([step(1, T0, 100.5), cpu("aten::mm", T0 + 1, 10.25), kernel("k", T0 + 5, 3, corr=1)])


@pytest.mark.parametrize(
    ("name", "content", "problem"),
    [
        ("trunc.json.gz", gzip.compress(json.dumps(GOOD).encode())[:-20], "truncated gzip file"),
        ("trunc.json", json.dumps(GOOD)[:-30], "truncated JSON"),
        ("text.json", "hello, world", "not valid JSON"),
        ("empty.json", "", "empty file"),
        ("list.json", "[1, 2]", "not a chrome trace: the top level is not a JSON object"),
        ("noevents.json", '{"schemaVersion": 1}', "JSON without traceEvents: not a chrome trace"),
        ("events.json", '{"traceEvents": {"a": 1}}', "wrong field type: Expected `array`, got `object`"),
        (
            "ts.json",
            '{"traceEvents": [{"ph": "X", "ts": "12"}]}',
            "wrong field type: Expected `int | float | null`, got `str` - at `$.traceEvents[0].ts`",
        ),
        ("name.json", '{"traceEvents": [{"ph": "X", "name": 3}]}', "at `$.traceEvents[0].name`"),
        ("args.json", '{"traceEvents": [{"ph": "X", "args": [1]}]}', "at `$.traceEvents[0].args`"),
        ("event.json", '{"traceEvents": [3]}', "at `$.traceEvents[0]`"),
        ("badgz.json.gz", b"\x1f\x8b\x08\x00garbage-garbage-garbage", "gzip"),
    ],
)
def test_bad_file_raises_one_line_input_error(tmp_path: Path, name: str, content: Any, problem: str) -> None:
    path = (
        write(tmp_path / "raw.bin", content)
        if isinstance(content, bytes)
        else write(tmp_path / name, content)
    )
    if isinstance(content, bytes):
        path = path.rename(tmp_path / name)
    with pytest.raises(InputError) as info:
        load_trace(path)
    assert info.value.path == str(path)
    assert problem in info.value.problem
    assert "\n" not in str(info.value)


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file or directory"):
        load_trace(tmp_path / "nope.json")


def test_directory_without_traces(tmp_path: Path) -> None:
    write(tmp_path / "readme.txt", "hi")
    with pytest.raises(InputError, match=r"directory has no trace files \(\*\.json, \*\.json\.gz\)"):
        load_trace(tmp_path)


def test_cli_bad_input_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "t.json", '{"traceEvents": [')
    assert main(["summary", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"stepscope: error: {path}: truncated JSON\n"


# --- property: random and mutated traces give a table or an InputError, nothing else -------------------
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
FIELDS = ["ph", "name", "cat", "pid", "tid", "ts", "dur", "id", "args", "s", "bp"]
events = st.lists(
    st.one_of(
        st.sampled_from(GOOD["traceEvents"]),
        st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=6),
        st.builds(
            lambda base, key, value: {**base, "args": {key: value}},
            st.sampled_from(GOOD["traceEvents"]),
            st.sampled_from(ARG_KEYS),
            json_values,
        ),
        st.builds(
            lambda ph, ts, dur: {"ph": ph, "name": "x", "ts": ts, "dur": dur},
            st.sampled_from(["X", "i", "M", "s", "f", "", "XY", "é"]),
            json_scalars,
            json_scalars,
        ),
    ),
    max_size=6,
)
documents = st.one_of(
    st.builds(
        lambda evs, top: {**top, "traceEvents": evs},
        events,
        st.dictionaries(
            st.sampled_from(["distributedInfo", "deviceProperties", "schemaVersion", "baseTimeNanoseconds"]),
            json_values,
            max_size=2,
        ),
    ),
    json_values,
)


def _check(path: Path) -> None:
    try:
        table = load_trace(path)
    except InputError as exc:
        assert exc.path == str(path) and exc.problem and "\n" not in exc.problem
        return
    assert isinstance(table, TraceTable)
    assert len({len(c) for c in table.columns.values()}) == 1


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=documents)
def test_random_documents_load_or_raise_input_error(tmp_path: Path, doc: Any) -> None:
    _check(write(tmp_path / "doc.json", doc))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), gz=st.booleans())
def test_mutated_bytes_load_or_raise_input_error(tmp_path: Path, data: st.DataObject, gz: bool) -> None:
    raw = bytearray(json.dumps(data.draw(st.sampled_from([GOOD, GOOD_EPOCH]))).encode())
    if gz:
        raw = bytearray(gzip.compress(bytes(raw)))
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["flip", "cut", "insert", "delete"]))
        at = data.draw(st.integers(0, max(len(raw) - 1, 0)))
        if kind == "flip" and raw:
            raw[at] = data.draw(st.integers(0, 255))
        elif kind == "cut":
            del raw[at:]
        elif kind == "insert":
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=4))
        elif raw:
            del raw[at]
    path = tmp_path / "mutated.json"
    path.write_bytes(bytes(raw))
    _check(path)
