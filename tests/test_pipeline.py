"""Pipeline parallelism (#28 item 5): stages and their order, micro-batches, each stage's bubble beside the
schedule's theoretical one, and the `pipeline_bubble` finding, on real torch.distributed.pipelining jobs
(tests/_pp_jobs.py: 2 stages on 2 gloo ranks, 4 micro-batches, ScheduleGPipe and Schedule1F1B) and a job without
a pipeline."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from .test_comm import analyze_json

JOBS = Path(__file__).with_name("_pp_jobs.py")
P2P = ("gloo:send", "gloo:recv", "c10d::send", "c10d::recv_")
Span = tuple[float, float]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The run folder of each job: gpipe, 1f1b, allreduce (one torchrun start for the three)."""
    out = tmp_path_factory.mktemp("pp")
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [
        str(torchrun),
        "--standalone",
        "--nproc_per_node",
        "2",
        str(JOBS),
        "gpipe,1f1b,allreduce",
        str(out),
    ]
    subprocess.run(cmd, check=True, capture_output=True, timeout=240)
    return {
        job: next(p for p in (out / job).iterdir() if p.is_dir()) for job in ("gpipe", "1f1b", "allreduce")
    }


def _union(spans: list[Span]) -> list[Span]:
    out: list[list[float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _minus(spans: list[Span], cut: list[Span]) -> list[Span]:
    out = []
    for a, b in spans:
        for c, d in cut:
            if d <= a or c >= b:
                continue
            if c > a:
                out.append((a, c))
            a = max(a, d)
        if a < b:
            out.append((a, b))
    return out


def _within(spans: list[Span], lo: float, hi: float) -> float:
    return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in spans)


def trace_bubble(run_dir: Path, rank: int) -> float:
    """The rank's bubble by docs/analysis.md's definition, read with json (not stepscope): the time in its send /
    recv ops and gloo's send / recv ranges that no CPU op other than a c10d op covers, over its ProfilerSteps'
    time."""
    (path,) = (run_dir / "traces").glob(f"rank{rank}_*.json.gz")
    events = [e for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"] if e.get("ph") == "X"]
    span = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events]
    steps = [s for e, s in zip(events, span, strict=True) if e["name"].startswith("ProfilerStep#")]
    p2p = _union([s for e, s in zip(events, span, strict=True) if e["name"] in P2P])
    c10d = [s for e, s in zip(events, span, strict=True) if e.get("cat") == "cpu_op" and "c10d" in e["name"]]
    ops = [
        s
        for e, s in zip(events, span, strict=True)
        if e.get("cat") == "cpu_op" and "c10d" not in e["name"] and e["name"] != "record_param_comms"
    ]
    compute = _minus(_union(ops), _union(c10d))
    waiting = _minus(p2p, _union(compute))
    return sum(_within(waiting, lo, hi) for lo, hi in steps) / sum(hi - lo for lo, hi in steps)


@pytest.mark.slow
@pytest.mark.parametrize(("job", "schedule"), [("gpipe", "GPipe"), ("1f1b", None)])
def test_pipeline_stages_bubbles_and_finding(runs: dict[str, Path], job: str, schedule: str | None) -> None:
    # GIVEN a 2-stage pipeline on 2 gloo ranks, 4 micro-batches a step, both ranks traced
    result = analyze_json(runs[job])
    pipeline = result["pipeline"]
    # THEN the stages are the ranks in the order the activations flow: 0 -> 1
    stages = pipeline["stages"]
    assert [(s["rank"], s["stage"], s["prev"], s["next"]) for s in stages] == [
        (0, 0, None, 1),
        (1, 1, 0, None),
    ]
    assert pipeline["num_stages"] == 2
    # the micro-batches: GPipe's "Forward i" ranges; 1F1B leaves none, the first stage's sends count them
    assert pipeline["micro_batches"] == 4
    assert pipeline["micro_batches_source"] == ("ranges" if job == "gpipe" else "p2p")
    assert pipeline["schedule"] == schedule
    assert pipeline["theoretical_bubble"] == pytest.approx(1 / 5)  # (p - 1) / (m + p - 1)
    for s in stages:
        # each stage's bubble is the share of its steps it waits in point-to-point ops with no compute, as the
        # trace file gives it
        assert s["bubble"] == pytest.approx(trace_bubble(runs[job], s["rank"]), abs=0.05)
        assert 0 < s["bubble_ms"] <= s["wait_ms"]
        assert s["compute_ms"] > 0
        assert s["steps"] == [2, 3]
        assert sum(s["step_bubble_ms"]) / 2 == pytest.approx(s["bubble_ms"], abs=0.002)
    # AND the finding prices the worst stage's bubble in each step (every stage waits for it), median step
    (found,) = [f for f in result["findings"] if f["id"] == "pipeline_bubble"]
    worst = [max(a, b) for a, b in zip(*(s["step_bubble_ms"] for s in stages), strict=True)]
    assert found["cost_ms_per_step"] == pytest.approx(sum(worst) / 2, abs=0.002)
    assert found["ranks"] == [0, 1]
    assert found["evidence"]["theoretical_bubble_pct"] == 20.0
    assert found["evidence"]["micro_batches"] == 4
    assert found["action"]


@pytest.mark.slow
def test_a_job_without_a_pipeline_has_none(runs: dict[str, Path]) -> None:
    # GIVEN 2 gloo ranks that all-reduce their gradients, no point-to-point op
    result = analyze_json(runs["allreduce"])
    # THEN analyze recognises no pipeline and says nothing of bubbles
    assert result["pipeline"] is None
    assert not [f for f in result["findings"] if f["id"] == "pipeline_bubble"]
    assert any(c["kind"] == "all_reduce" for c in result["ranks"][0]["collectives"])


@pytest.mark.slow
def test_terminal_and_report_show_the_stages(runs: dict[str, Path], tmp_path: Path) -> None:
    from click.testing import CliRunner

    from stepscope.cli import cli

    # GIVEN the GPipe run, analysed as JSON
    stages = analyze_json(runs["gpipe"])["pipeline"]["stages"]
    # WHEN analyze prints its tables (wide) and report writes the page
    printed = CliRunner().invoke(cli, ["analyze", str(runs["gpipe"]), "--wide"])
    assert printed.exit_code == 0, printed.output
    page = tmp_path / "report.html"
    written = CliRunner().invoke(cli, ["report", str(runs["gpipe"]), "-o", str(page)])
    assert written.exit_code == 0, written.output
    html = page.read_text()
    # THEN both show the stages' table: every stage's rank and bubble, and the pipeline's line
    assert "Pipeline stages" in printed.output
    assert "2 stages, 4 micro-batches a step (from pipelining's ranges); GPipe" in printed.output.replace(
        "\n", " "
    )
    assert 'id="pipeline-stages"' in html or "pipeline-stages" in html
    for s in stages:
        bubble = f"{100 * s['bubble']:.1f}%"
        assert bubble in printed.output and bubble in html
    assert "Pipeline: 2 stages, 4 micro-batches a step" in html
