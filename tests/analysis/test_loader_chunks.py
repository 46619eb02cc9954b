"""The chunked reader: any layout, any chunk size, gives the reference table; odd files take the whole-file
path and read exactly as before (same table, same error)."""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepscope.analysis.read import _stream, _text
from stepscope.analysis.read._decode import load_whole
from stepscope.analysis.read.loader import merge_tables
from stepscope.analysis.read.table import TraceTable
from stepscope.errors import InputError

from ..support.reference import reference
from ..support.synthetic import RICH_EVENTS
from ..support.tables import assert_same_table
from ..support.traces import ARG_KEYS, cpu, kernel, step, trace, write

T0 = 1712195495519689.047  # epoch microseconds with a ns fraction

EVENTS = [
    *RICH_EVENTS,
    # a cut spot `}, {` inside an event (an array of objects in args) and inside strings
    cpu("nested", 40, 1, shapes=[{"a": 1}, {"b": [2, 3]}], note="x}, {y"),
    {"ph": "X", "name": "}, {\n}, {", "cat": "cpu_op", "ts": 41, "dur": 1, "pid": 1, "tid": 1},
    # 2021 schema: string tids, old categories, "external id"
    {"ph": "X", "cat": "Operator", "name": "aten::add", "pid": 5, "tid": "5555", "ts": 42, "dur": 2},
    {
        "ph": "X",
        "cat": "Kernel",
        "name": "k2",
        "pid": 0,
        "tid": "stream 7",
        "ts": 43,
        "dur": 1,
        "args": {"stream": 7, "device": 0, "external id": 43, "correlation": 1},
    },
    *(kernel(f"gemm{i % 3}", 50 + i, 0.5, corr=100 + i) for i in range(12)),
    *(cpu(f"aten::op{i % 5}", 60 + i, 0.25, **{"External id": i}) for i in range(12)),
    step(2, 80, 20),
]


def layouts(doc: dict[str, Any]) -> dict[str, str]:
    """The same document written as profilers and tools write JSON."""
    events = doc["traceEvents"]
    header = {k: v for k, v in doc.items() if k != "traceEvents"}
    return {
        "compact": json.dumps(doc, separators=(",", ":")),
        "spaced": json.dumps(doc),
        "pretty": json.dumps(doc, indent=2),  # multi-line events
        "kineto": "{\n"
        + "".join(f'  "{k}": {json.dumps(v)},\n' for k, v in header.items())
        + '  "traceEvents": [\n'
        + ",\n".join("  " + json.dumps(e) for e in events)
        + "\n]}",
        "header_after": json.dumps({"traceEvents": events, **header}, indent=1),
        "comma_first": '{"traceEvents": ['
        + "\n,".join(json.dumps(e) for e in events)
        + "\n]"
        + "".join(f', "{k}": {json.dumps(v)}' for k, v in header.items())
        + "}",
    }


@pytest.fixture
def no_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail if a file is sent to the whole-file decoder."""

    def refuse(path: Path, rank_hint: int | None, **options: Any) -> None:
        raise AssertionError(f"{path} fell back to the whole-file decoder")

    monkeypatch.setattr(_stream, "load_whole", refuse)


@pytest.fixture(params=["isal", "zlib"])
def inflate(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run with ISA-L's inflate (the default where installed) and with zlib's (the fallback)."""
    if request.param == "zlib":
        monkeypatch.setattr(_text, "INFLATE", zlib)
    else:
        pytest.importorskip("isal")
        assert _text.INFLATE is not zlib
    return str(request.param)


def load(path: Path, chunk_bytes: int) -> TraceTable:
    return merge_tables([_stream.load_file(path, chunk_bytes=chunk_bytes)])


def whole(path: Path) -> TraceTable:
    return merge_tables([load_whole(path, None)])


@pytest.mark.parametrize("layout", ["compact", "spaced", "pretty", "kineto", "header_after", "comma_first"])
@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.usefixtures("no_fallback")
def test_every_chunk_size_gives_the_reference_table(tmp_path: Path, layout: str, gz: bool) -> None:
    # GIVEN a trace in one of the layouts writers use
    text = layouts(trace(EVENTS, rank=3))[layout]
    path = write(tmp_path / ("t.json.gz" if gz else "t.json"), text)
    expected = reference(path, 3)
    # WHEN it is read in chunks of every size from one byte to more than the whole array
    for chunk_bytes in [*range(1, 200, 7), *range(200, len(text) + 100, 97)]:
        table = load(path, chunk_bytes)
        # THEN the table is the reference one, and so is what the file says about its rank
        assert_same_table(table, expected)
        info = table.ranks[3]
        assert (info.world_size, info.backend) == (2, "nccl")


@pytest.mark.usefixtures("no_fallback")
def test_header_keys_before_and_after_the_array(tmp_path: Path) -> None:
    # GIVEN header keys on both sides of the array, one of them repeated (the last value counts in JSON), and
    # keys the loader skips
    text = (
        '{"schemaVersion": 1, "distributedInfo": {"rank": 5, "world_size": 8}, "deviceProperties": [{"id": 1}], '
        '"traceEvents": ['
        + ", ".join(json.dumps(cpu(f"o{i}", i, 1)) for i in range(40))
        + '], "baseTimeNanoseconds": 1700000000000000000, "schemaVersion": 2, "deviceProperties": [{"id": 0}]}'
    )
    path = write(tmp_path / "t.json", text)
    for chunk_bytes in (1, 50, 300, 10_000):
        info = load(path, chunk_bytes).ranks[5]
        assert info.world_size == 8 and info.device_properties == [{"id": 0}]


@pytest.mark.parametrize(
    "text",
    [
        # a second traceEvents key: JSON keeps the last array
        '{"traceEvents": [{"ph": "X", "name": "first", "ts": 1}], "traceEvents": [{"ph": "X", "name": "last"}]}',
        '{"traceEvents": [{"ph": "X", "name": "first", "ts": 1}], "trace\\u0045vents": [{"ph": "i", "name": "b"}]}',
        '{"trace\\u0045vents": [{"ph": "X", "name": "first"}], "traceEvents": [{"ph": "i", "name": "last"}]}',
        # the key inside a nested object first
        '{"meta": {"traceEvents": []}, "traceEvents": [{"ph": "X", "name": "a"}, {"ph": "X", "name": "b"}]}',
        # a key that ends in traceEvents
        '{"x\\"traceEvents": [], "traceEvents": [{"ph": "X", "name": "a"}, {"ph": "X", "name": "b"}]}',
        # no whitespace anywhere, and a lot of it
        '{"traceEvents":[{"ph":"X","name":"a"},{"ph":"X","name":"b"}]}',
        '{ "traceEvents" :\n\n [\n\n {"ph": "X", "name": "a"} \n\n , \n\n {"ph": "X", "name": "b"}\n\n ] \n}\n',
        '{"traceEvents": []}',
        '{"traceEvents": [], "schemaVersion": 3}',
    ],
)
def test_odd_documents_read_like_the_whole_file(tmp_path: Path, text: str) -> None:
    path = write(tmp_path / "t.json", text)
    for chunk_bytes in (1, 5, 1000):
        assert_same_table(load(path, chunk_bytes), whole(path))
        assert load(path, chunk_bytes).ranks[0] == whole(path).ranks[0]


@pytest.mark.parametrize("layout", ["compact", "pretty"])
@pytest.mark.usefixtures("no_fallback", "inflate")
def test_gzip_tables_are_the_same_with_either_inflate(tmp_path: Path, layout: str) -> None:
    path = write(tmp_path / "t.json.gz", layouts(trace(EVENTS, rank=3))[layout])
    expected = reference(path, 3)
    for chunk_bytes in (1, 97, 1000, 10**6):
        assert_same_table(load(path, chunk_bytes), expected)


@pytest.mark.usefixtures("inflate")
def test_a_changed_byte_that_only_the_crc_sees_is_an_error(tmp_path: Path) -> None:
    # GIVEN a gzip file of stored (uncompressed) blocks in which one letter of a name was changed: the
    # deflate stream and the JSON are still valid, only the CRC-32 of the gzip trailer tells
    text = json.dumps(BIG).encode()
    data = bytearray(gzip.compress(text, compresslevel=0))
    at = data.index(b'"op150"')
    data[at + 1 : at + 3] = b"OP"
    path = tmp_path / "t.json.gz"
    path.write_bytes(bytes(data))
    # THEN loading it is an error naming the file, not a table with a name nobody wrote
    with pytest.raises(InputError, match=r"corrupt gzip data \(CRC check failed\)") as info:
        load(path, 4096)
    assert info.value.path == str(path)


@pytest.mark.usefixtures("inflate")
def test_gzip_with_several_members_or_trailing_bytes(tmp_path: Path) -> None:
    text = json.dumps(trace([cpu(f"o{i}", i, 1) for i in range(50)]))
    half = len(text) // 2
    two_members = gzip.compress(text[:half].encode()) + gzip.compress(text[half:].encode())
    path = tmp_path / "two.json.gz"
    path.write_bytes(two_members)
    assert_same_table(load(path, 100), reference(path))
    padded = tmp_path / "padded.json.gz"
    padded.write_bytes(gzip.compress(text.encode()) + b"\0" * 10)
    assert_same_table(load(padded, 100), reference(padded))
    garbage = tmp_path / "garbage.json.gz"
    garbage.write_bytes(gzip.compress(text.encode()) + b"garbage")
    with pytest.raises(InputError, match="corrupt gzip data"):
        load(garbage, 100)


BIG = trace([cpu(f"op{i}", 1000 + i, 1, **{"External id": i}) for i in range(300)], rank=0)


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        (lambda t: t[: len(t) * 3 // 4], "truncated JSON"),
        (lambda t: t.replace('"name": "op250"', '"name": 250'), "at `$.traceEvents[250].name`"),
        (lambda t: t.replace('"ts": 1250', '"ts": "1250"'), "at `$.traceEvents[250].ts`"),
        (lambda t: t.replace('"name": "op250", ', '"name": "op250" '), "not valid JSON"),
        (lambda t: t + "}", "not valid JSON"),
    ],
)
@pytest.mark.parametrize("gz", [False, True])
def test_errors_late_in_the_file_read_as_before(tmp_path: Path, mutate: Any, problem: str, gz: bool) -> None:
    # GIVEN a file that goes wrong far after the first chunks
    path = write(tmp_path / ("t.json.gz" if gz else "t.json"), mutate(json.dumps(BIG)))
    # WHEN read in small chunks THEN the error names the file and the event, as the whole-file decoder does
    for chunk_bytes in (64, 4096):
        with pytest.raises(InputError) as info:
            load(path, chunk_bytes)
        assert problem in info.value.problem and info.value.path == str(path)
    with pytest.raises(InputError) as whole_info:
        whole(path)
    assert info.value.problem == whole_info.value.problem


@pytest.mark.usefixtures("inflate")
def test_truncated_gzip_is_reported_as_such(tmp_path: Path) -> None:
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(json.dumps(BIG).encode())[:-100])
    with pytest.raises(InputError, match="truncated gzip file"):
        load(path, 64)


@pytest.mark.usefixtures("no_fallback")
def test_epoch_float_timestamps_from_a_late_chunk_on_are_exact(tmp_path: Path) -> None:
    # GIVEN small integer timestamps first, epoch floats with a ns fraction only after many chunks
    early = [json.dumps(cpu(f"early{i}", 1000 + i, 1)) for i in range(200)]
    late = [
        f'{{"ph": "X", "name": "late{i}", "ts": {1712195495519689 + i}.047, "dur": 0.001}}' for i in range(50)
    ]
    path = write(tmp_path / "t.json", '{"traceEvents": [' + ", ".join(early + late) + "]}")
    # WHEN read in small chunks THEN every timestamp is exact to the ns
    table = load(path, 256)
    assert table.columns["ts"].tolist()[-50:] == [1712195495519689047 + 1000 * i for i in range(50)]
    assert_same_table(table, reference(path))


def test_string_timestamp_after_epoch_floats_reads_as_before(tmp_path: Path) -> None:
    events: list[Any] = [cpu(f"o{i}", T0 + i, 1) for i in range(100)]
    events[80]["ts"] = "x"
    path = write(tmp_path / "t.json", trace(events))
    with pytest.raises(InputError, match=r"wrong field type: `ts` of event 80 is b'\"x\"'"):
        load(path, 128)


@pytest.mark.usefixtures("no_fallback")
def test_odd_field_types_in_some_chunks(tmp_path: Path) -> None:
    # GIVEN a file whose middle has values the strict Structs reject (null name and args, float ids)
    events: list[Any] = [cpu(f"o{i}", i, 1, correlation=i) for i in range(120)]
    events[40] = {"ph": "X", "name": None, "args": None, "ts": 40}
    events[41] = {"ph": "X", "name": "floaty", "pid": 1.0, "tid": 2.5, "ts": 41, "args": {"stream": "7"}}
    events[90] = {"ph": "X", "name": "big", "ts": 90, "args": {"correlation": 2**70, "External id": True}}
    path = write(tmp_path / "t.json", trace(events))
    for chunk_bytes in (100, 1000, 100_000):
        assert_same_table(load(path, chunk_bytes), reference(path))


@pytest.mark.usefixtures("no_fallback")
def test_events_larger_than_the_buffer(tmp_path: Path) -> None:
    long_name = "x" * 300_000
    events = [cpu("a", 1, 1), cpu(long_name, 2, 1), cpu("b", 3, 1), cpu(long_name, 4, 1)]
    path = write(tmp_path / "t.json.gz", trace(events))
    for chunk_bytes in (10, 100_000):
        table = load(path, chunk_bytes)
        assert [table.name_of(i) for i in range(4)] == ["a", long_name, "b", long_name]


def test_progress_is_reported_up_to_the_end(tmp_path: Path) -> None:
    path = write(tmp_path / "t.json.gz", BIG)
    seen: list[float] = []
    _stream.load_file(path, progress=seen.append, chunk_bytes=256)
    assert len(seen) > 5 and seen == sorted(seen) and seen[0] == 0.0 and seen[-1] == 1.0


# --- property: any well-formed trace, any layout, any chunk size -----------------------------------------
ids = st.one_of(st.integers(-5, 2**66), st.sampled_from(["5555", "stream 7", "", "x}, {"]), st.none())
event = st.fixed_dictionaries(
    {
        "ph": st.sampled_from(["X", "X", "i", "s", "f", "M", "b"]),
        "name": st.one_of(st.sampled_from(["aten::mm", "k", "process_name", "}, {", "é"]), st.none()),
        "pid": ids,
        "tid": ids,
        "ts": st.one_of(
            st.integers(-(10**6), 2**52),
            st.builds(lambda i, f: i + f / 1000, st.integers(0, 2**40), st.integers(0, 999)),
        ),
    },
    optional={
        "cat": st.sampled_from(["cpu_op", "kernel", "Kernel", "gpu_memcpy", "ac2g"]),
        "dur": st.integers(-10, 2**40),
        "id": ids,
        "args": st.dictionaries(
            st.sampled_from(ARG_KEYS),
            st.one_of(st.integers(-(2**70), 2**70), st.text(max_size=3), st.none(), st.just([{"a": 1}, {}])),
            max_size=4,
        ),
    },
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    events=st.lists(event, max_size=30),
    layout=st.sampled_from(["compact", "pretty", "kineto", "header_after", "comma_first"]),
    chunk_bytes=st.integers(1, 400),
    gz=st.booleans(),
)
def test_random_traces_in_chunks_match_reference(
    tmp_path: Path, events: list[Any], layout: str, chunk_bytes: int, gz: bool
) -> None:
    path = write(tmp_path / ("t.json.gz" if gz else "t.json"), layouts(trace(events, rank=0))[layout])
    table = load(path, chunk_bytes)
    ref = reference(path)
    assert_same_table(table, ref)


def test_small_chunks_are_decoded_one_by_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from stepscope.analysis.read._columns import ColumnBuilder

    sizes: list[int] = []
    add = ColumnBuilder.add
    monkeypatch.setattr(
        ColumnBuilder, "add", lambda self, chunk: (sizes.append(len(chunk.events)), add(self, chunk))
    )
    path = write(tmp_path / "t.json.gz", layouts(trace(EVENTS))["pretty"])
    load(path, 1)
    assert len(sizes) == len(EVENTS) and set(sizes) == {1}  # every cut between two events was taken
    sizes.clear()
    load(path, 1 << 20)
    assert sizes == [len(EVENTS)]  # one piece: the rest of the file


def test_events_holding_lists_of_objects_are_cut_around_however_long_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a trace whose every 25th event holds a list of 8 objects in its args (a `}` `,` `{` inside the event
    # at each), 400 KB long against an event limit of 64 KB: the loader tried four cuts of a piece, then wanted
    # the rest of the file in one piece, and refused the file ("no place to split the events found")
    monkeypatch.setenv("STEPSCOPE_MAX_EVENT_BYTES", str(1 << 16))
    events = [cpu(f"op{i}", 10.0 * i, 5.0) for i in range(4000)]
    for e in events[7::25]:
        e["args"] = {"objs": [{"a": j} for j in range(8)]}
    path = write(tmp_path / "t.json", trace(events))
    assert path.stat().st_size > 5 * (1 << 16)
    # WHEN it is read by the loader in pieces of 4 KB and by the event stream in pieces of 4 KB
    from stepscope.analysis.read.event_stream import iter_event_batches

    table = _stream.load_file(path, chunk_bytes=4096)
    streamed = [e for batch in iter_event_batches(path, batch_bytes=4096) for e in batch]
    # THEN both read every event, as the whole-file decoder does
    assert_same_table(merge_tables([table]), merge_tables([load_whole(path, None)]))
    assert streamed == json.loads(path.read_text())["traceEvents"]


def test_events_each_holding_a_long_list_of_objects_keep_their_pieces_small(tmp_path: Path) -> None:
    # GIVEN a trace whose every event holds a list of 300 objects: almost every `}` `,` `{` is inside an event
    # (cutting at twice the distance after four such cuts grew the pieces to the end of the file: 327 MB for
    # merge on 17.6 MB of such events)
    from stepscope.analysis.read.event_stream import iter_event_batches

    events = [cpu(f"op{i}", 10.0 * i, 5.0) for i in range(300)]
    for e in events:
        e["args"] = {"objs": [{"k": j} for j in range(300)]}
    path = write(tmp_path / "t.json", trace(events))
    longest = max(len(json.dumps(e)) for e in events)
    # WHEN the event stream reads it in pieces of 16 KB, and the loader too
    batches = list(iter_event_batches(path, batch_bytes=16384))
    table = _stream.load_file(path, chunk_bytes=16384)
    # THEN every event is read, and no piece is much longer than its target (at most one event past it)
    assert [e for b in batches for e in b] == json.loads(path.read_text())["traceEvents"]
    assert len(batches) > 10 and max(len(json.dumps(b)) for b in batches[:-1]) < 16384 + 2 * longest
    assert_same_table(merge_tables([table]), merge_tables([load_whole(path, None)]))


def test_a_gzip_trace_damaged_inside_a_member_is_said_to_be_damaged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a gzip trace with one byte changed in the middle of its data: it inflates to other text, and the
    # member's CRC is checked only at its end, after that text has been read
    from stepscope.cli import main

    events = [cpu(f"op{i}", 10.0 * i, 5.0) for i in range(20000)]
    data = bytearray(gzip.compress(json.dumps(trace(events)).encode()))
    data[len(data) // 2] ^= 0xFF
    path = tmp_path / "t.json.gz"
    path.write_bytes(bytes(data))
    # WHEN analyze and ops read it
    for command in ("analyze", "ops"):
        assert main([command, str(path), "--json"]) == 2
        err = capsys.readouterr().err
        # THEN each says the gzip data is damaged (they said a JSON error at some byte, or gave the CRC in
        # other words)
        assert err.strip() == f"stepscope: error: {path}: corrupt gzip data (CRC check failed)", err


def test_a_traceevents_key_inside_a_value_after_the_array_is_no_second_array(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a trace with a key after its array whose value holds a `traceEvents` key of its own, and one with a
    # second top-level traceEvents key
    from stepscope.analysis.read.event_stream import iter_event_batches
    from stepscope.cli import main

    events = [cpu(f"op{i}", 10.0 * i, 5.0) for i in range(50)]
    nested = tmp_path / "nested.json"
    nested.write_text(json.dumps({**trace(events), "meta": {"traceEvents": []}}))
    second = tmp_path / "second.json"
    second.write_text(json.dumps(trace(events))[:-1] + ', "traceEvents": []}')
    # WHEN the event stream reads them
    # THEN the first is read whole (the event stream refused it as a second array; the loader read it)
    assert [e for b in iter_event_batches(nested) for e in b] == trace(events)["traceEvents"]
    assert main(["ops", str(nested), "--json"]) == 0
    capsys.readouterr()
    # AND the second, whose last traceEvents value JSON keeps, is refused by what cannot stream it
    assert main(["ops", str(second), "--json"]) == 2
    assert capsys.readouterr().err.strip().endswith("a second traceEvents array: cannot be merged")
