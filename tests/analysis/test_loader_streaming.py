"""The trace loader streams every file it reads (issue #34, item 14): several gzip members, a byte order mark, a
field of the wrong type or a JSON error late in the file, a second traceEvents key. None of them sends the file
to the whole-file decoder (about three times the text in memory); what still goes there is refused past the
event limit. A sparse manifest of gigabytes is refused by its size; nothing ends in a MemoryError traceback."""

from __future__ import annotations

import gzip
import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stepscope.analysis.read import _stream
from stepscope.analysis.read._decode import load_whole
from stepscope.analysis.read.event_stream import iter_event_batches
from stepscope.analysis.read.loader import load_trace, merge_tables
from stepscope.cli import main as cli_main
from stepscope.errors import InputError
from stepscope.runfolder.layout import MANIFEST_NAME

from ..support.reference import reference
from ..support.tables import assert_same_table
from ..support.traces import cpu, kernel, step, trace, write

EVENTS = [
    step(1, 0, 5000),
    *(cpu(f"aten::op{i % 7}", 10 + 3 * i, 2, **{"External id": i}) for i in range(400)),
    *(kernel(f"gemm{i % 3}", 20 + 3 * i, 1, corr=i) for i in range(200)),
]
TEXT = json.dumps(trace(EVENTS, rank=1), indent=1)


@pytest.fixture
def streamed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail if a file is sent to the whole-file decoder."""

    def refuse(path: Path, rank_hint: int | None, **options: Any) -> None:
        raise AssertionError(f"{path} was decoded whole ({options.get('why')})")

    monkeypatch.setattr(_stream, "load_whole", refuse)


def whole_error(path: Path) -> str:
    with pytest.raises(InputError) as info:
        load_whole(path, None)
    return info.value.problem


def load(path: Path, chunk_bytes: int) -> Any:
    return merge_tables([_stream.load_file(path, chunk_bytes=chunk_bytes)])


@pytest.mark.usefixtures("streamed")
def test_several_gzip_members_stream_to_the_same_table(tmp_path: Path) -> None:
    # GIVEN the trace as one gzip member, and as four (pigz / bgzip style) with zero padding between two
    data = TEXT.encode()
    one = tmp_path / "one.json.gz"
    one.write_bytes(gzip.compress(data))
    quarter = len(data) // 4
    members = [gzip.compress(data[i : i + quarter]) for i in range(0, len(data), quarter)]
    several = tmp_path / "several.json.gz"
    several.write_bytes(members[0] + b"\0" * 5 + b"".join(members[1:]) + b"\0" * 3)
    # WHEN each is loaded in small pieces THEN both give the plain file's table, without a whole-file decode
    expected = reference(write(tmp_path / "plain.json", TEXT), 1)
    for chunk_bytes in (100, 4096):
        assert_same_table(load(one, chunk_bytes), expected)
        assert_same_table(load(several, chunk_bytes), expected)
    assert_same_table(load_trace(several), expected)


def test_every_member_of_a_small_gzip_file_is_streamed(tmp_path: Path) -> None:
    # merge's event stream reads a file in pieces of 64 KB: members that begin in its last piece (all of a
    # small file's) are read too, not only the first
    data = TEXT.encode()
    half = len(data) // 2
    path = tmp_path / "two.json.gz"
    path.write_bytes(gzip.compress(data[:half]) + b"\0" * 2 + gzip.compress(data[half:]) + b"\0")
    events = [e for batch in iter_event_batches(path) for e in batch]
    assert events == json.loads(TEXT)["traceEvents"]


def test_bytes_after_the_last_member_are_still_an_error(tmp_path: Path) -> None:
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(TEXT.encode()) + gzip.compress(b"]}")[:12])
    with pytest.raises(InputError, match="truncated gzip file"):
        load(path, 100)
    path.write_bytes(gzip.compress(TEXT.encode()) + b"\x1f")
    with pytest.raises(InputError, match="corrupt gzip data"):
        load(path, 100)


@pytest.mark.usefixtures("streamed")
@pytest.mark.parametrize("gz", [False, True])
def test_a_byte_order_mark_is_accepted(tmp_path: Path, gz: bool) -> None:
    plain = write(tmp_path / "plain.json", TEXT)
    data = b"\xef\xbb\xbf" + TEXT.encode()
    path = tmp_path / ("bom.json.gz" if gz else "bom.json")
    path.write_bytes(gzip.compress(data) if gz else data)
    assert_same_table(load_trace(path), reference(plain, 1))
    assert cli_main(["summary", str(path)]) == 0


def test_the_whole_file_decoder_reads_a_byte_order_mark_too(tmp_path: Path) -> None:
    plain = write(tmp_path / "plain.json", TEXT)
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + TEXT.encode())
    assert_same_table(merge_tables([load_whole(path, None)]), reference(plain, 1))


LATE_ERRORS = [
    # a field of the wrong type in the last event, in one far before the end, a `ts` that is no number
    (lambda t: t[: t.rindex('"dur": 1')] + '"dur": "1"' + t[t.rindex('"dur": 1') + 8 :], "wrong field type"),
    (lambda t: t.replace('"name": "aten::op3"', '"name": 3', 1), "wrong field type"),
    # JSON errors: in the middle, at the end, a truncated file, a second document after the first
    (lambda t: t.replace('"name": "gemm2"', '"name": "gemm2" "x"', 1), "not valid JSON"),
    (lambda t: t[: t.rindex("]")] + ",]}", "not valid JSON"),
    (lambda t: t[: len(t) - 200], "truncated JSON"),
    (lambda t: t + "{}", "not valid JSON"),
]


@pytest.mark.usefixtures("streamed")
@pytest.mark.parametrize(("mutate", "kind"), LATE_ERRORS)
@pytest.mark.parametrize("gz", [False, True])
def test_late_errors_are_found_without_decoding_the_file_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mutate: Any, kind: str, gz: bool
) -> None:
    # GIVEN a file that goes wrong far from its start
    text = mutate(TEXT)
    path = write(tmp_path / ("t.json.gz" if gz else "t.json"), text)
    monkeypatch.undo()
    expected = whole_error(path)  # what the whole-file decoder says: the reference message
    assert expected.startswith(kind)
    monkeypatch.setattr(_stream, "load_whole", lambda *a, **k: pytest.fail("decoded whole"))
    # WHEN it is read in pieces of any size THEN the error is the same, named in the whole file's terms
    for chunk_bytes in (50, 700, 4096, 1 << 20):
        with pytest.raises(InputError) as info:
            load(path, chunk_bytes)
        assert info.value.problem == expected and info.value.path == str(path)


@pytest.mark.usefixtures("streamed")
def test_a_second_trace_events_key_replaces_the_first_array_without_a_whole_decode(tmp_path: Path) -> None:
    # GIVEN a long first array, then a second traceEvents key (JSON keeps the last value), then the header
    last = [cpu("last", 5, 1), cpu("again", 7, 1)]
    header = json.dumps({k: v for k, v in trace(EVENTS, rank=1).items() if k != "traceEvents"})
    first = '{"traceEvents": ' + json.dumps(EVENTS, indent=1)
    path = write(tmp_path / "t.json", first + ', "traceEvents": ' + json.dumps(last) + ", " + header[1:])
    only_last = write(tmp_path / "last.json", json.dumps(trace(last, rank=1)))
    # THEN the table holds the second array's events only, as a JSON parser reads it; the rank still counts
    for chunk_bytes in (64, 4096):
        assert_same_table(load(path, chunk_bytes), reference(only_last, 1))
    # AND the key's name inside a string after the array replaces nothing
    decoy = write(tmp_path / "d.json", first + ', "note": "\\"traceEvents\\": [1]", ' + header[1:])
    assert_same_table(load(decoy, 64), reference(write(tmp_path / "p.json", TEXT), 1))


def test_what_is_decoded_whole_is_refused_past_the_event_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a file the chunked reader cannot vouch for (a traceEvents key inside an object before the real one)
    text = '{"meta": {"traceEvents": []}, ' + TEXT[1:]
    path = write(tmp_path / "t.json", text)
    assert len(load_trace(path)) > 0  # small: decoded whole
    # WHEN the event limit is below its size THEN one line says why it would be decoded whole, exit 2
    monkeypatch.setenv("STEPSCOPE_MAX_EVENT_BYTES", str(len(text) // 2))
    assert cli_main(["summary", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(path) in err
    assert "decoding it whole would take more than" in err and "STEPSCOPE_MAX_EVENT_BYTES" in err


def test_a_file_without_trace_events_is_refused_after_the_event_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN 2 MB of JSON object with no traceEvents key, and an event limit of 64 KB
    path = write(tmp_path / "t.json", json.dumps({"other": ["x" * 100] * 20_000}))
    monkeypatch.setenv("STEPSCOPE_MAX_EVENT_BYTES", str(1 << 16))
    # THEN it is refused as not a chrome trace once that much text held no traceEvents key
    with pytest.raises(InputError, match="no traceEvents array in its first 65536 bytes: not a chrome trace"):
        load_trace(path)


def test_a_sparse_huge_manifest_is_refused_by_its_size(tmp_path: Path) -> None:
    # GIVEN a run folder whose manifest.json is 8 GiB, almost all of it a hole (no disk, no time to write)
    run = tmp_path / "run"
    run.mkdir()
    manifest = run / MANIFEST_NAME
    with open(manifest, "wb") as fh:
        fh.write(b'{"schema": "stepscope.manifest/2", "artifacts": []}')
        fh.truncate(8 << 30)
    # WHEN analyzed in a subprocess under a 2 GiB address-space limit THEN one line names the file, exit 2
    done = _run_limited(["analyze", str(run)], 2 << 30)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(manifest) in lines[0] and "over the limit" in lines[0]


def _run_limited(args: list[str], address_space: int, **env_vars: str) -> subprocess.CompletedProcess[str]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", **env_vars}
    return subprocess.run(
        [sys.executable, "-m", "stepscope", *args],
        preexec_fn=limit,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.mark.slow
def test_under_an_address_space_limit_odd_gzip_files_load_or_fail_in_one_line(tmp_path: Path) -> None:
    # GIVEN traces of 60,000 events: as three gzip members, with a wrong type in the last event, gzipped with
    # an odd head (read whole: the gzip path that once asked for 16 GiB up front)
    events = [cpu(f"aten::op{i % 50}", 2 * i, 1) for i in range(60_000)]
    text = json.dumps(trace(events, rank=0))
    data = text.encode()
    third = len(data) // 3 + 1
    members = tmp_path / "members.json.gz"
    members.write_bytes(b"".join(gzip.compress(data[i : i + third]) for i in range(0, len(data), third)))
    wrong = tmp_path / "wrong.json.gz"
    at = text.rindex('"dur": 1')
    wrong.write_bytes(gzip.compress((text[:at] + '"dur": []' + text[at + 8 :]).encode()))
    odd = tmp_path / "odd.json.gz"
    odd.write_bytes(gzip.compress(('{"meta": {"traceEvents": []}, ' + text[1:]).encode()))
    # WHEN each is summarized under a 3 GiB address-space limit, with a gzip ratio limit that allows 16 GiB
    for path, status in ((members, 0), (wrong, 2), (odd, 0)):
        done = _run_limited(["summary", str(path)], 3 << 30, STEPSCOPE_MAX_GZIP_RATIO="100000000")
        # THEN it loads, or says what is wrong in one line: never a MemoryError traceback
        assert done.returncode == status, done.stderr
        assert "Traceback" not in done.stderr and "MemoryError" not in done.stderr
        if status:
            assert len(done.stderr.strip().splitlines()) == 1 and "wrong field type" in done.stderr
