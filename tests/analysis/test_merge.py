"""`stepscope merge` on synthetic ranks: offsets, flows, the round trip through our loader, and bad outputs."""

from __future__ import annotations

import gzip
import json
import os
import stat
from pathlib import Path

import pytest

from stepscope.analysis.read.loader import load_trace
from stepscope.cli import main

from ..support.synthetic import rank_trace
from ..support.traces import write_trace


@pytest.fixture
def two_ranks(tmp_path: Path) -> Path:
    # (12 steps: rank 1 last at 12 all-reduces of 12, which jitter gives one of 2 ranks with chance 1/2048)
    write_trace(tmp_path / "run" / "r0.json", rank_trace(1000, steps=12), rank=0, world_size=2)
    write_trace(tmp_path / "run" / "r1.json", rank_trace(4000, shift_us=250, steps=12), rank=1, world_size=2)
    return tmp_path / "run"


def test_merge_aligns_links_and_loads_back(
    two_ranks: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "merged.json.gz"
    assert main(["merge", str(two_ranks), "-o", str(out)]) == 0
    assert "2 ranks, clocks aligned on 12 matched collectives" in capsys.readouterr().out
    doc = json.loads(gzip.decompress(out.read_bytes()))
    assert [(r["rank"], r["pid"], r["clock_offset_us"]) for r in doc["stepscopeMerge"]["ranks"]] == [
        (0, 1, 0.0),
        (1, 2, 250.0),
    ]
    # rank 1's events are moved back by its offset: both steps start together
    starts = {e["pid"]: e["ts"] for e in doc["traceEvents"] if e.get("name") == "ProfilerStep#1"}
    assert starts[1] == starts[2]
    # one arrow per matched all-reduce, forward in time, from the kernel on one rank to the other's
    flows = [e for e in doc["traceEvents"] if e.get("cat") == "stepscope_collective"]
    assert len(flows) == 24
    for start, end in zip(flows[::2], flows[1::2], strict=True):
        assert (start["ph"], end["ph"], start["id"]) == ("s", "f", end["id"]) and start["ts"] <= end["ts"]
    # the launch flows of the two ranks keep distinct ids
    table = load_trace(out)
    assert table.rank_ids() == [0, 1]
    assert main(["analyze", str(out), "--json"]) == 0
    analysis = json.loads(capsys.readouterr().out)
    assert analysis["straggler"]["rank"] == 1
    assert [r["clock_offset_us"] for r in analysis["ranks"]] == [0.0, 0.0]


def test_bad_outputs_are_one_line_and_exit_2(
    two_ranks: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert main(["merge", str(two_ranks), "-o", str(fifo)]) == 2
    assert stat.S_ISFIFO(fifo.stat().st_mode)  # never replaced
    missing = tmp_path / "no" / "such" / "m.json.gz"
    assert main(["merge", str(two_ranks), "-o", str(missing)]) == 2
    assert not (tmp_path / "no").exists()  # no folder made on the way
    merged = tmp_path / "m.json.gz"
    assert main(["merge", str(two_ranks), "-o", str(merged)]) == 0
    capsys.readouterr()
    assert main(["merge", str(merged), "-o", str(tmp_path / "again.json.gz")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "already a merged trace" in err[0]


def test_without_o_an_earlier_merge_is_never_replaced(
    two_ranks: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a merged.json.gz in the current folder, from an earlier merge
    monkeypatch.chdir(tmp_path)
    (tmp_path / "merged.json.gz").write_bytes(b"an earlier merge")
    # WHEN merge runs without -o, twice
    assert main(["merge", str(two_ranks)]) == 0
    out, err = capsys.readouterr()
    assert main(["merge", str(two_ranks)]) == 0
    again = capsys.readouterr().out
    # THEN the earlier file is kept, and each merge goes to a new name that it names
    assert (tmp_path / "merged.json.gz").read_bytes() == b"an earlier merge"
    assert out.startswith("merged-2.json.gz: 2 ranks") and again.startswith("merged-3.json.gz: 2 ranks")
    assert "merged.json.gz exists (kept); writing merged-2.json.gz" in err
    assert load_trace(tmp_path / "merged-2.json.gz").rank_ids() == [0, 1]
    # ... and -o names a file to replace
    assert main(["merge", str(two_ranks), "-o", "merged.json.gz"]) == 0
    assert load_trace(tmp_path / "merged.json.gz").rank_ids() == [0, 1]
