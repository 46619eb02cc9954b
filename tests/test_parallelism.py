"""Parallelism, measured true (#28): collectives by the kind the job issued, each in its process group, on real
torchrun gloo jobs (tests/_parallel_jobs.py) and synthetic GPU traces."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from .test_comm import analyze_json

JOBS = Path(__file__).with_name("_parallel_jobs.py")


def run_job(job: str, ranks: int, out: Path) -> Path:
    """Run a tiny parallel job with torchrun on gloo; its run folder."""
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--standalone", "--nproc_per_node", str(ranks), str(JOBS), job, str(out)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=240)
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return run_dir


def trace_ops(run_dir: Path, rank: int) -> Counter[str]:
    """Count of each c10d / functional collective op in a rank's trace, read with json (not stepscope)."""
    (path,) = (run_dir / "traces").glob(f"rank{rank}_*.json.gz")
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    return Counter(e["name"] for e in events if "c10d" in e.get("name", "") and e.get("ph") == "X")


@pytest.fixture(scope="module")
def fsdp2_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_job("fsdp2", 2, tmp_path_factory.mktemp("fsdp2"))


@pytest.mark.slow
def test_fsdp2_collectives_by_issued_kind(fsdp2_run: Path) -> None:
    # GIVEN FSDP2 (fully_shard on 4 Linear layers) on 2 gloo ranks, 2 steps recorded: gloo runs every
    # c10d::_reduce_scatter_base_ as a `gloo:all_reduce` range
    result = analyze_json(fsdp2_run)
    for rank in (0, 1):
        ops = trace_ops(fsdp2_run, rank)
        assert ops["c10d::_reduce_scatter_base_"] > 0 and "c10d::allreduce_" not in ops
        # THEN analyze counts the collectives the job issued: reduce-scatters and all-gathers, no all-reduce
        stats = {c["kind"]: c for c in result["ranks"][rank]["collectives"]}
        assert set(stats) == {"reduce_scatter", "all_gather"}
        assert stats["reduce_scatter"]["count"] == ops["c10d::_reduce_scatter_base_"]
        assert stats["all_gather"]["count"] == ops["c10d::_allgather_base_"]
        assert all(c["time_source"] == "cpu" and c["time_ms"] > 0 for c in stats.values())
