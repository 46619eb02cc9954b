"""`stepscope merge` aligns the ranks from the few events alignment needs, found by streaming each file, and
holds memory that does not grow with the events (issue #34 item 12)."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from typing import Any

import pytest

from stepscope.cli import main

from ..support.jobs import merge_in_child as _merge_in_child

GPU = ("kernel", "gpu_memcpy", "gpu_memset")
SHIFTS_US = {0: 0.0, 1: 1234.5, 2: -777.25}


def _ranks_from_one(source: Path, folder: Path, *, by_context: bool) -> int:
    """Three ranks made from one real NCCL trace: clocks shifted by SHIFTS_US (kernels jittered by up to 3 us),
    rank 2's GPU events written before its CPU events (launches after their kernels in the file); with
    `by_context`, the NCCL kernels renamed so that only their launch inside a collective range says they
    communicate. Returns the complete ('X') events of one rank."""
    doc = json.loads(gzip.decompress(source.read_bytes()))
    rng = random.Random(7)
    folder.mkdir()
    for rank, shift in SHIFTS_US.items():
        events: list[dict[str, Any]] = json.loads(json.dumps(doc["traceEvents"]))
        for e in events:
            if isinstance(e.get("ts"), (int, float)):
                e["ts"] += shift + (rng.random() * 3 if e.get("cat") == "kernel" else 0)
            if by_context and e.get("cat") == "kernel" and "nccl" in e.get("name", ""):
                e["name"] = "xfer_" + e["name"].split("_", 1)[1].replace("AllReduce", "Red").replace(
                    "Broadcast", "Bc"
                )
        if rank == 2:
            events.sort(key=lambda e: e.get("cat") not in GPU)
        info = {**doc["distributedInfo"], "rank": rank, "world_size": 3}
        body = {**doc, "distributedInfo": info, "traceEvents": events}
        (folder / f"rank{rank}.json.gz").write_bytes(gzip.compress(json.dumps(body).encode(), 1))
    return sum(1 for e in doc["traceEvents"] if e.get("ph") == "X")


@pytest.mark.shared
@pytest.mark.parametrize("by_context", [False, True], ids=["kernels named nccl", "kernels known by launch"])
@pytest.mark.slow
def test_merge_aligns_as_analyze_does_from_the_events_it_keeps(
    shared_traces: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], by_context: bool
) -> None:
    # GIVEN three ranks of a real NCCL job, their clocks apart, one with its launches after its kernels
    folder = tmp_path / "ranks"
    n = _ranks_from_one(
        shared_traces / "hta_nccl_parser_config" / "nccl_data.json.gz", folder, by_context=by_context
    )
    # WHEN they are merged, and analyzed (which reads every event)
    out = tmp_path / "merged.json.gz"
    assert main(["merge", str(folder), "-o", str(out)]) == 0
    said = capsys.readouterr().out
    assert main(["analyze", str(folder), "--json"]) == 0
    analyzed = json.loads(capsys.readouterr().out)["cross_rank"]["alignment"]
    # THEN merge aligns the clocks exactly as analyze does, on the collectives the ranks share
    doc = json.loads(gzip.decompress(out.read_bytes()))
    header = doc["stepscopeMerge"]
    assert header["alignment"] == analyzed and analyzed["method"] == "collectives"
    assert f"clocks aligned on {analyzed['matched']} matched collectives" in said
    offsets = {r["rank"]: r["clock_offset_us"] for r in header["ranks"]}
    assert all(abs(offsets[r] - shift) < 5 for r, shift in SHIFTS_US.items()), offsets
    # AND every event is there, with one arrow between each pair of ranks of each matched collective
    events = doc["traceEvents"]
    flows = [e for e in events if e.get("cat") == "stepscope_collective"]
    assert header["flows"] == analyzed["matched"] * 2 and len(flows) == 2 * header["flows"]
    assert sum(1 for e in events if e.get("ph") == "X") == 3 * n


@pytest.mark.slow
def test_merge_memory_does_not_grow_with_the_events(tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from bench_merge import write_rank

    # GIVEN two ranks of 50,000 events each, and two of 500,000
    peaks = {}
    for events in (50_000, 500_000):
        folder = tmp_path / f"ranks{events}"
        folder.mkdir()
        for rank in range(2):
            write_rank(folder / f"rank{rank}.json.gz", rank, events, 2)
        # WHEN each pair is merged in a process limited to 768 MB of address space
        out = tmp_path / f"merged{events}.json.gz"
        code, err, peaks[events], _ = _merge_in_child(folder, out, 768 << 20)
        assert code == 0, err
        with gzip.open(out, "rb") as fh:
            merged = json.loads(fh.read())["traceEvents"]
        assert sum(1 for e in merged if e["ph"] == "X") == 2 * events
    # THEN ten times the events take about the same memory (with the whole table loaded: 87 and 271 MiB)
    assert peaks[500_000] < peaks[50_000] + 60, peaks


# --- issue 47 item 10 -------------------------------------------------------------------------------------
def _events_text(n: int) -> bytes:
    step = (
        '{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1, "ts": 0, "dur": '
    )
    ops = (
        f'{{"ph": "X", "cat": "cpu_op", "name": "aten::op{i % 50}", "pid": 1, "tid": 1, "ts": {i}, "dur": 1}}'
        for i in range(n)
    )
    return ('{"traceEvents": [' + ",\n".join([f"{step}{n + 1}}}", *ops]) + "]}").encode()


def test_merge_reads_a_gzip_of_several_members(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN 20 MB of JSON gzipped as pigz and bgzip write it: two members, one after the other (gzip -t passes)
    text = _events_text(240_000)
    assert len(text) > 20_000_000
    half = len(text) // 2
    path = tmp_path / "two.json.gz"
    path.write_bytes(gzip.compress(text[:half], 1) + gzip.compress(text[half:], 1))
    # WHEN it is merged
    code = main(["merge", str(path), "-o", str(tmp_path / "merged.json")])
    # THEN every event is in the merged trace (it was refused as corrupt gzip data past ~16 MB)
    assert code == 0, capsys.readouterr().err
    merged = json.loads((tmp_path / "merged.json").read_text())
    assert sum(e.get("cat") == "cpu_op" for e in merged["traceEvents"]) == 240_000


def test_merge_refuses_a_gzip_bomb_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN 3 MB of gzip that inflates to 3 GB: one string of spaces
    import time

    path = tmp_path / "bomb.json.gz"
    with gzip.open(path, "wb", compresslevel=9) as fh:
        fh.write(b'{"traceEvents": [{"ph": "X", "name": "')
        for _ in range(180):
            fh.write(b" " * (1 << 24))
        fh.write(b'", "ts": 1, "dur": 1, "pid": 1, "tid": 1}]}')
    # WHEN it is merged
    started = time.monotonic()
    code = main(["merge", str(path), "-o", str(tmp_path / "merged.json")])
    # THEN it is refused as a bomb in one line, in seconds (65 s before)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "a gzip bomb?" in err[0] and str(path) in err[0]
    assert time.monotonic() - started < 15
