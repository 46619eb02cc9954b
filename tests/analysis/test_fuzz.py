"""Fuzzing the two readers of untrusted files and what analyses their results: the trace loader with `analyze`,
and the memory-file reader with its analysis. Whatever bytes they get, they return a result or raise InputError
(one line, exit 2 in the CLI), never anything else.

`make test` runs a few hundred cases; a long run on demand (the command and its findings: docs/reliability.md):

    STEPSCOPE_FUZZ_EXAMPLES=20000 .venv/bin/python -m pytest tests/analysis/test_fuzz.py -q
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepscope.analysis.analyze import analyze
from stepscope.analysis.memory.snapshot import analyze_memory_file
from stepscope.analysis.read.loader import load_trace
from stepscope.cli import main as cli_main
from stepscope.errors import InputError
from stepscope.units import BIDI_CODES

from ..support.traces import cpu, launched, step

EXAMPLES = int(os.environ.get("STEPSCOPE_FUZZ_EXAMPLES", "150"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

SEED_TRACE = json.dumps(
    {
        "schemaVersion": 1,
        "distributedInfo": {"rank": 0, "world_size": 1},
        "traceEvents": [
            step(1, 0, 1000),
            cpu("aten::mm", 10, 100, **{"Input Dims": [[2, 2]]}),
            *launched("gemm_kernel", 20, 200, 50, corr=1),
            cpu("ProfilerStep#2", 1000, 500, cat="user_annotation"),
        ],
    }
).encode()
SEED_SNAPSHOT = pickle.dumps(
    {
        "segments": [
            {
                "device": 0,
                "address": 1,
                "total_size": 4096,
                "segment_type": "small",
                "blocks": [
                    {
                        "size": 512,
                        "requested_size": 500,
                        "address": 1,
                        "state": "active_allocated",
                        "frames": [{"filename": "train.py", "line": 3, "name": "f"}],
                    }
                ],
            }
        ],
        "device_traces": [[{"action": "alloc", "addr": 1, "size": 512, "time_us": 5.0, "frames": []}]],
    },
    protocol=4,
)


@st.composite
def mutated(draw: Any, seed: bytes) -> bytes:
    """`seed` with a few random edits: bytes replaced, inserted or deleted, a cut, maybe gzip'd."""
    data = bytearray(seed)
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["replace", "insert", "delete", "truncate", "duplicate"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "replace" and data:
            data[at] = draw(st.integers(0, 255))
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete" and data:
            del data[at : at + draw(st.integers(1, 8))]
        elif kind == "truncate":
            del data[at:]
        elif kind == "duplicate":
            end = min(len(data), at + draw(st.integers(1, 64)))
            data[at:at] = data[at:end]
    raw = bytes(data)
    return gzip.compress(raw) if draw(st.booleans()) else raw


def _only_input_errors(call: Any) -> None:
    try:
        call()
    except InputError as exc:
        assert "\n" not in str(exc), str(exc)


@FUZZ
@given(data=mutated(SEED_TRACE))
def test_fuzzed_traces_load_or_raise_input_error(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / ("t.json.gz" if data[:2] == b"\x1f\x8b" else "t.json")
    path.write_bytes(data)
    _only_input_errors(lambda: analyze(load_trace(path, workers=1)))


@FUZZ
@given(data=mutated(SEED_SNAPSHOT))
def test_fuzzed_snapshots_analyze_or_raise_input_error(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "s.pickle"
    path.write_bytes(data)
    _only_input_errors(lambda: analyze_memory_file(path))


# Names with C0, C1 and bidirectional controls (and rich markup's characters), as op, kernel and file names: the
# CLI's output, text and JSON, and its error lines carry none of them raw.
_CONTROLS = [chr(c) for c in (*range(0x20), 0x7F, *range(0x80, 0xA0), *BIDI_CODES)]
_NAMES = st.text(alphabet=st.sampled_from([*_CONTROLS, *"ab[]=;:/ "]), min_size=1, max_size=12)


def _raw_controls(text: str) -> list[str]:
    return [c for c in text if c in _CONTROLS and c != "\n"]


@FUZZ
@given(op=_NAMES, kernel=_NAMES, file=_NAMES.map(lambda n: n.replace("/", "_").replace("\x00", "_")))
def test_fuzzed_names_never_reach_the_terminal_raw(
    tmp_path: Path, capsysbinary: Any, op: str, kernel: str, file: str
) -> None:
    trace = {"traceEvents": [step(1, 0, 1000), cpu(op, 10, 100), *launched(kernel, 20, 200, 50, corr=1)]}
    path = tmp_path / f"t{file}.json"
    path.write_text(json.dumps(trace))
    broken = tmp_path / f"b{file}.json"
    broken.write_text("{")
    commands = (["summary", str(path), "--wide"], ["summary", str(path), "--json"], ["summary", str(broken)])
    for command in commands:
        status = cli_main(command)
        captured = capsysbinary.readouterr()
        out, err = captured.out.decode("utf-8"), captured.err.decode("utf-8")
        assert status == (2 if command[1] == str(broken) else 0), err
        assert _raw_controls(out + err) == [], (command, _raw_controls(out + err))
        if command[-1] == "--json":  # escaped, the names read back as they were
            assert op in _strings(json.loads(out))


def _strings(doc: Any) -> set[str]:
    if isinstance(doc, str):
        return {doc}
    if isinstance(doc, dict):
        return set(doc).union(*(_strings(v) for v in doc.values()))
    return set().union(*(_strings(v) for v in doc)) if isinstance(doc, list) else set()


# Opcodes that address the memo, with indices that are huge, out of range or just right, and memo-heavy streams
# (each value stored and fetched again): Python's own unpickler sized its memo by the largest index asked for.
MEMO_OPCODES = st.one_of(
    st.integers(0, 2**32 - 1).map(lambda i: b"r" + i.to_bytes(4, "little")),  # LONG_BINPUT
    st.integers(0, 2**32 - 1).map(lambda i: b"j" + i.to_bytes(4, "little")),  # LONG_BINGET
    st.integers(0, 255).map(lambda i: b"h" + bytes([i])),  # BINGET
    st.integers(0, 255).map(lambda i: b"q" + bytes([i])),  # BINPUT
    st.integers(0, 2**40).map(lambda i: b"p%d\n" % i),  # PUT (text)
    st.integers(0, 2**40).map(lambda i: b"g%d\n" % i),  # GET (text)
    st.sampled_from([b"\x94", b"]", b"}", b"(", b"e", b"N", b"0", b"2", b"a", b"K\x07", b"\x8c\x01a"]),
)


@FUZZ
@given(
    at=st.integers(0, len(SEED_SNAPSHOT)),
    ops=st.lists(MEMO_OPCODES, min_size=1, max_size=40),
    repeat=st.sampled_from([1, 1, 1000]),
)
def test_memo_opcodes_with_any_index_analyze_or_raise_input_error(
    tmp_path: Path, at: int, ops: list[bytes], repeat: int
) -> None:
    path = tmp_path / "memo.pickle"
    path.write_bytes(SEED_SNAPSHOT[:at] + b"".join(ops) * repeat + SEED_SNAPSHOT[at:])
    _only_input_errors(lambda: analyze_memory_file(path))
