from __future__ import annotations

import json
from pathlib import Path

import pytest

from stepscope.runfolder import read_manifest

from ..support.jobs import torchrun
from ..support.output import load_chrome_trace

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(("ranks", "recording"), [("0", [0]), ("all", [0, 1])])
def test_two_rank_job_shares_one_run_folder(tmp_path: Path, ranks: str, recording: list[int]) -> None:
    reports = torchrun(tmp_path, ranks)
    # THEN both ranks name the same folder, and it is the only one
    assert reports[0]["run_dir"] == reports[1]["run_dir"]
    run_dirs = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert len(run_dirs) == 1 and str(run_dirs[0]) == reports[0]["run_dir"]
    run_dir = run_dirs[0]
    manifest = read_manifest(run_dir)
    assert manifest.world_size == 2 and manifest.profiled_ranks == recording
    traces = sorted((a.rank, a.step) for a in manifest.artifacts if a.kind == "trace")
    assert traces == [(r, 3) for r in recording]
    assert [r["recording"] for r in reports] == [r in recording for r in (0, 1)]
    for artifact in manifest.artifacts:
        assert (run_dir / artifact.path).is_file()
    for rank in recording:
        trace = load_chrome_trace(run_dir / f"traces/rank{rank}_step3.json.gz")
        assert trace["distributedInfo"]["rank"] == rank
        assert any(str(e.get("name", "")).startswith("gloo:") for e in trace["traceEvents"])
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sorted({m["rank"] for m in metrics}) == recording
    assert len(metrics) == 6 * len(recording)
    # DDP keeps the ranks in step: the same losses everywhere
    assert reports[0]["losses"] == reports[1]["losses"]
