"""Pipeline parallelism (#28 item 5): stages and their order, micro-batches, each stage's bubble beside the
schedule's theoretical one, and the `pipeline_bubble` finding, on real torch.distributed.pipelining jobs
(tests/support/jobs/pipeline.py: 2 gloo ranks, 4 micro-batches, ScheduleGPipe and Schedule1F1B with a stage per rank,
ScheduleInterleaved1F1B with two) and a job without a pipeline, and on synthetic NCCL pipelines."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

from ..support.jobs import run_ranks
from ..support.output import analyze_json
from ..support.traces import Event, cpu, launched, step, write

JOBS = Path(__file__).parents[1] / "support" / "jobs" / "pipeline.py"
Span = tuple[float, float]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The run folder of each job: gpipe, 1f1b, interleaved, allreduce (one torchrun start for all)."""
    out = tmp_path_factory.mktemp("pp")
    torchrun = Path(sys.executable).with_name("torchrun")
    jobs = ("gpipe", "1f1b", "interleaved", "allreduce")
    cmd = [str(torchrun), "--standalone", "--nproc_per_node", "2", str(JOBS), ",".join(jobs), str(out)]
    run_ranks(cmd, out, check=True, timeout=240)
    return {job: next(p for p in (out / job).iterdir() if p.is_dir()) for job in jobs}


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
    """The rank's bubble by docs/analysis.md's definition, read with json (not stepscope): the time in gloo's
    receive ranges that no CPU op other than a c10d op covers, over its ProfilerSteps' time (a CPU backend's
    sends stay open while the sender goes on: not waiting)."""
    (path,) = (run_dir / "traces").glob(f"rank{rank}_*.json.gz")
    events = [e for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"] if e.get("ph") == "X"]
    span = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events]
    steps = [s for e, s in zip(events, span, strict=True) if e["name"].startswith("ProfilerStep#")]
    p2p = _union([s for e, s in zip(events, span, strict=True) if e["name"] == "gloo:recv"])
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
@pytest.mark.parametrize(
    ("job", "schedule", "source", "v"),
    [("gpipe", "GPipe", "ranges", 1), ("1f1b", None, "p2p", 1), ("interleaved", "interleaved", "ranges", 2)],
)
def test_pipeline_stages_bubbles_and_finding(
    runs: dict[str, Path], job: str, schedule: str | None, source: str, v: int
) -> None:
    # GIVEN a pipeline on 2 gloo ranks (v stages each), 4 micro-batches a step, both ranks traced
    result = analyze_json(runs[job])
    pipeline = result["pipeline"]
    # THEN the stages are the ranks in the order the activations flow: 0 -> 1
    stages = pipeline["stages"]
    order = [(s["rank"], s["stage"], s["prev"], s["next"]) for s in stages]
    assert order == [(0, 0, None, 1), (1, 1, 0, None)]
    assert pipeline["num_stages"] == 2
    # the micro-batches: GPipe's "Forward i" ranges, the interleaved schedule's "PP:<stage>F<i>" actions; 1F1B
    # leaves none, the first stage's sends count them
    assert pipeline["micro_batches"] == 4
    assert pipeline["micro_batches_source"] == source
    assert (pipeline["schedule"], pipeline["stages_per_rank"]) == (schedule, v)
    assert pipeline["theoretical_bubble"] == pytest.approx(
        1 / (v * 4 + 1), abs=1e-4
    )  # (p - 1) / (v m + p - 1)
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
    assert found["evidence"]["theoretical_bubble_pct"] == pytest.approx(100 / (v * 4 + 1), abs=0.01)
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
    # (the page: in its Parallelism section, the line leading the table's caption)
    section = html[html.index('id="parallelism"') : html.index('id="ranks"')]
    assert "pipeline-stages" in section
    assert "2 stages, 4 micro-batches a step (from pipelining&#39;s ranges); GPipe" in section
    for s in stages:
        bubble = f"{100 * s['bubble']:.1f}%"
        assert bubble in printed.output and bubble in section


# --- synthetic GPU pipelines (NCCL): the peers of c10d ops, the wait as the send / recv kernels ---------------
SENDRECV = "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)"
Op = tuple[str, float, float, int]  # (kind: compute | send | recv, kernel start us, duration us, peer)


def gpu_rank(ops: list[Op], rank: int, world: int, groups: list[list[int]]) -> dict:  # type: ignore[type-arg]
    """One rank's trace of a single 1000 us step: each op a kernel; a send / recv issued by its c10d op, whose
    recorded inputs name the peer (a rank of the op's group), with the launch inside it."""
    events: list[Event] = [step(1, 0, 1000)]
    for corr, (kind, ts, dur, peer) in enumerate(ops, start=1):
        if kind == "compute":
            events += launched("sm90_xmma_gemm_f16f16_f32", ts - 4, ts, dur, corr)
            continue
        op = {"send": "c10d::send", "recv": "c10d::recv_"}[kind]
        events.append(cpu(op, ts - 6, 4, **{"Concrete Inputs": ["", "", str(peer), "0"]}))
        events += launched(SENDRECV, ts - 5, ts, dur, corr)
    pg_config = [
        {
            "pg_name": str(i),
            "pg_desc": "default_pg" if i == 0 else f"group_{i}",
            "pg_size": len(g),
            "ranks": g,
        }
        for i, g in enumerate(groups)
    ]
    info = {
        "backend": "nccl",
        "rank": rank,
        "world_size": world,
        "pg_count": len(groups),
        "pg_config": pg_config,
    }
    return {"schemaVersion": 1, "traceEvents": events, "distributedInfo": info}


def expected_bubble(ops: list[Op]) -> float:
    """The p2p kernels' time that no compute kernel covers, over the 1000 us step."""
    compute = _union([(ts, ts + d) for kind, ts, d, _ in ops if kind == "compute"])
    p2p = _union([(ts, ts + d) for kind, ts, d, _ in ops if kind != "compute"])
    return sum(b - a for a, b in _minus(p2p, compute)) / 1000


def test_gpu_pipeline_of_three_stages_in_a_pipeline_group(tmp_path: Path) -> None:
    # GIVEN 3 pipeline stages on global ranks 1, 3, 5 of 6: their ops name peers in the pipeline group [1, 3, 5]
    # (each rank is also in the default group and a data-parallel pair); 2 micro-batches forward, then the
    # gradients back; the stages' first ops: stage 0 sends, the others receive from the stage before
    stages: dict[int, list[Op]] = {
        1: [("compute", 10, 100, 0), ("send", 120, 10, 1), ("compute", 130, 100, 0), ("send", 240, 10, 1),
            ("recv", 600, 100, 1), ("compute", 700, 200, 0)],
        3: [("recv", 10, 110, 0), ("compute", 130, 100, 0), ("send", 240, 10, 2), ("recv", 250, 10, 0),
            ("compute", 260, 100, 0), ("send", 370, 10, 2), ("recv", 500, 60, 2), ("compute", 560, 100, 0),
            ("send", 670, 10, 0)],
        5: [("recv", 10, 240, 1), ("compute", 250, 100, 0), ("recv", 360, 20, 1), ("compute", 380, 100, 0),
            ("send", 490, 10, 1)],
    }  # fmt: skip
    for rank, ops in stages.items():
        groups = [list(range(6)), [1, 3, 5], [rank - 1, rank]]
        write(tmp_path / f"rank{rank}.json", gpu_rank(ops, rank, 6, groups))
    result = analyze_json(tmp_path)
    pipeline = result["pipeline"]
    # THEN the stages are ranks 1 -> 3 -> 5, the peers read as global ranks through the pipeline group
    got = [(s["rank"], s["stage"], s["prev"], s["next"]) for s in pipeline["stages"]]
    assert got == [(1, 0, None, 3), (3, 1, 1, 5), (5, 2, 3, None)]
    assert (pipeline["num_stages"], pipeline["micro_batches"], pipeline["micro_batches_source"]) == (
        3,
        2,
        "p2p",
    )
    assert pipeline["schedule"] is None
    assert pipeline["theoretical_bubble"] == 0.5  # (3 - 1) / (2 + 3 - 1)
    # each stage's bubble: its send / recv kernels' time that no compute kernel covers (not its CPU c10d ops)
    for s in pipeline["stages"]:
        assert s["bubble"] == pytest.approx(expected_bubble(stages[s["rank"]]), abs=1e-4)
    # AND the finding: priced by the worst stage (rank 5: 270 us a step), near the schedule's own bubble, so
    # its action is more micro-batches
    (found,) = [f for f in result["findings"] if f["id"] == "pipeline_bubble"]
    assert (found["rank"], found["ranks"], found["cost_ms_per_step"]) == (5, [1, 3, 5], 0.27)
    assert found["action"].startswith("run more micro-batches per step")


def test_a_stage_that_computes_most_is_to_be_balanced(tmp_path: Path) -> None:
    # GIVEN 2 stages (ranks 0, 1 of 2), 2 micro-batches: stage 1 computes 800 us a step, stage 0 150 us, so
    # stage 0 waits for it 790 us, far beyond the theoretical third of the step
    stages: dict[int, list[Op]] = {
        0: [("compute", 10, 50, 0), ("send", 60, 10, 1), ("compute", 70, 50, 0), ("send", 120, 10, 1),
            ("recv", 130, 770, 1), ("compute", 900, 50, 0)],
        1: [("recv", 10, 60, 0), ("compute", 70, 400, 0), ("recv", 470, 10, 0), ("compute", 480, 400, 0),
            ("send", 880, 10, 0)],
    }  # fmt: skip
    for rank, ops in stages.items():
        write(tmp_path / f"rank{rank}.json", gpu_rank(ops, rank, 2, [[0, 1]]))
    result = analyze_json(tmp_path)
    assert [s["bubble"] for s in result["pipeline"]["stages"]] == [0.79, 0.08]
    # THEN pipeline_bubble says to balance the stages, naming the one that computes most
    (found,) = [f for f in result["findings"] if f["id"] == "pipeline_bubble"]
    assert found["cost_ms_per_step"] == 0.79
    assert found["action"].startswith("balance the stages: stage 1 (rank 1) computes 800 us per step")


def _without_inputs(run_dir: Path, out: Path, world: int | None = None) -> Path:
    """The run's traces as a job recorded without record_shapes writes them (no Concrete Inputs), into `out`;
    `world`: claimed to be ranks of a default group of that many ranks."""
    for path in sorted((run_dir / "traces").glob("rank*.json.gz")):
        doc = json.loads(gzip.decompress(path.read_bytes()))
        for event in doc["traceEvents"]:
            for key in ("Concrete Inputs", "Input Dims", "Input type", "Input Strides"):
                event.get("args", {}).pop(key, None)
        if world is not None:
            info = doc["distributedInfo"]
            info["world_size"] = world
            for group in info["pg_config"]:
                group["ranks"], group["pg_size"] = list(range(world)), world
        write(out / path.name, doc)
    return out


@pytest.mark.slow
def test_without_recorded_inputs_a_group_of_two_names_the_peers(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    # GIVEN the GPipe job's traces without their recorded inputs: no op names its peer
    with_inputs = analyze_json(runs["gpipe"] / "traces")["pipeline"]
    result = analyze_json(_without_inputs(runs["gpipe"], tmp_path))
    # THEN each rank's only group has two members: the other one is the peer, the same stages and bubbles
    pipeline = result["pipeline"]
    assert [(s["rank"], s["stage"], s["prev"], s["next"]) for s in pipeline["stages"]] == [
        (0, 0, None, 1),
        (1, 1, 0, None),
    ]
    assert [s["bubble"] for s in pipeline["stages"]] == [s["bubble"] for s in with_inputs["stages"]]
    assert any("whose other member is taken as the peer" in n for n in pipeline["notes"])
    assert [f for f in result["findings"] if f["id"] == "pipeline_bubble"]


@pytest.mark.slow
def test_without_recorded_inputs_in_a_larger_group_the_peers_are_unknown_and_said(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    # GIVEN the same traces, as ranks of a group of 4 (two of them not traced): the peer could be any of 3
    result = analyze_json(_without_inputs(runs["gpipe"], tmp_path, world=4))
    # THEN no pipeline is recognised, no bubble is priced, and the notices say why (8 ops a step, 2 steps)
    assert result["pipeline"] is None
    assert not [f for f in result["findings"] if f["id"] == "pipeline_bubble"]
    for rank in (0, 1):
        assert any(n.startswith(f"rank {rank}: its 16 point-to-point ops") for n in result["notices"])


@pytest.mark.parametrize("send_first", [True, False])
def test_a_ring_of_sends_is_no_pipeline(tmp_path: Path, send_first: bool) -> None:
    # GIVEN 4 ranks passing blocks around a ring (context parallelism's pattern): each sends to the next rank and
    # receives from the one before, three times a step
    for rank in range(4):
        ops: list[Op] = []
        for k in range(3):
            t = 10 + 300 * k
            xfer = [("send", t, 20, (rank + 1) % 4), ("recv", t + 30, 20, (rank - 1) % 4)]
            ops += [*(xfer if send_first else xfer[::-1]), ("compute", t + 60, 200, 0)]
        write(tmp_path / f"rank{rank}.json", gpu_rank(ops, rank, 4, [[0, 1, 2, 3]]))
    # THEN analyze recognises no pipeline: no stage receives its first micro-batch from the one that sends to it
    result = analyze_json(tmp_path)
    assert result["pipeline"] is None
    assert not [f for f in result["findings"] if f["id"] == "pipeline_bubble"]


@pytest.mark.slow
def test_one_traced_stage_is_a_stage_whose_place_is_known_only_from_the_first(runs: dict[str, Path]) -> None:
    # GIVEN one rank's trace alone (the monitor's default traces rank 0 only)
    (first,) = (runs["gpipe"] / "traces").glob("rank0_*.json.gz")
    (last,) = (runs["1f1b"] / "traces").glob("rank1_*.json.gz")
    # THEN the first stage of GPipe is stage 0, sending to rank 1; p is unknown, so is the theoretical bubble
    pipeline = analyze_json(first)["pipeline"]
    (stage,) = pipeline["stages"]
    assert (stage["rank"], stage["stage"], stage["prev"], stage["next"]) == (0, 0, None, 1)
    assert (pipeline["num_stages"], pipeline["micro_batches"], pipeline["theoretical_bubble"]) == (
        None,
        4,
        None,
    )
    # AND the last stage of 1F1B receives from rank 0, its position unknown; the finding still prices its bubble
    result = analyze_json(last)
    (stage,) = result["pipeline"]["stages"]
    assert (stage["rank"], stage["stage"], stage["prev"], stage["next"]) == (1, None, 0, None)
    assert result["pipeline"]["micro_batches"] is None  # (only the first stage's sends count them)
    (found,) = [f for f in result["findings"] if f["id"] == "pipeline_bubble"]
    assert found["cost_ms_per_step"] == pytest.approx(stage["bubble_ms"], abs=0.002)
    assert "the most on rank 1" in found["message"]


@pytest.mark.slow
def test_a_gpipe_job_at_the_defaults_has_its_bubble_per_stage(tmp_path: Path) -> None:
    # GIVEN a 2-stage GPipe job (4 micro-batches, gloo) under the monitor at its default options (no recorded
    # inputs: no op names its peer), which times its own waits on receives (tests/support/jobs/pipeline_defaults.py)
    torchrun = Path(sys.executable).with_name("torchrun")
    job = Path(__file__).parents[1] / "support" / "jobs" / "pipeline_defaults.py"
    cmd = [str(torchrun), "--standalone", "--nproc_per_node", "2", str(job), str(tmp_path)]
    run_ranks(cmd, tmp_path, check=True, timeout=240)
    (run_dir,) = (tmp_path / "runs").iterdir()
    # THEN the run folder records each rank's stage, and the pipeline view is there with a bubble per stage
    groups = [json.loads((run_dir / "process_groups" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [g["pipeline_stages"] for g in groups] == [
        [{"stage_index": r, "num_stages": 2, "group": "0", "stage_ranks": [0, 1]}] for r in (0, 1)
    ]
    result = analyze_json(run_dir)
    pipeline = result["pipeline"]
    assert pipeline is not None and pipeline["num_stages"] == 2 and pipeline["schedule"] == "GPipe"
    # the point-to-point ops' waiting is the bubble: not collectives "that could not be matched"
    assert not [f for f in result["findings"] if f["id"] == "comm_wait_unknown"]
    assert any(n.startswith("the ranks issue point-to-point ops only") for n in result["notices"])
    assert any("as capture recorded them" in n for n in pipeline["notes"])
    for s in pipeline["stages"]:
        # each stage's bubble within 10 points of the share of its steps the job waited on its receives
        waits = json.loads((tmp_path / f"waits_rank{s['rank']}.json").read_text())
        steps = [waits[str(n)] for n in s["steps"]]
        measured = sum(w[0] for w in steps) / sum(w[2] for w in steps)
        assert s["bubble"] == pytest.approx(measured, abs=0.10), (s, measured)
