"""FSDP per unit (#28 item 4): units, their all-gathers and reduce-scatters per step, the exposed all-gather time
and the fsdp_exposed_all_gather finding, on real FSDP2 jobs on 2 gloo ranks (tests/support/jobs/fsdp.py) and on a
synthetic FSDP1 trace (torch 2.13 refuses FSDP1 on CPU)."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from ..support.jobs import run_ranks
from ..support.output import analyze_json
from ..support.traces import cpu, launched, step, write_trace

JOBS = Path(__file__).parents[1] / "support" / "jobs" / "fsdp.py"
FINDING = "fsdp_exposed_all_gather"


def run_job(job: str, out: Path) -> Path:
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--standalone", "--nproc_per_node", "2", str(JOBS), job, str(out)]
    run_ranks(cmd, out, check=True, timeout=240)
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return run_dir


@pytest.fixture(scope="module")
def exposed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_job("exposed", tmp_path_factory.mktemp("exposed"))


@pytest.fixture(scope="module")
def hidden_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_job("hidden", tmp_path_factory.mktemp("hidden"))


def events_of(run_dir: Path, rank: int) -> list[dict[str, Any]]:
    """A rank's complete events, read with json (not stepscope)."""
    (path,) = (run_dir / "traces").glob(f"rank{rank}_*.json.gz")
    doc = json.loads(gzip.decompress(path.read_bytes()))
    return [e for e in doc["traceEvents"] if e.get("ph") == "X"]


def inside(outer: dict[str, Any], inner: dict[str, Any]) -> bool:
    return (
        inner["tid"] == outer["tid"]
        and outer["ts"] <= inner["ts"] < outer["ts"] + outer["dur"]
    )  # fmt: skip


def union_ms(spans: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Length in ms of the union of (start, end) spans in us, clipped to [lo, hi)."""
    total, reach = 0.0, lo
    for s, e in sorted(spans):
        s, e = max(s, reach), min(e, hi)
        if e > s:
            total += e - s
            reach = e
    return total / 1000


def overlap_ms(a: list[tuple[float, float]], b: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Length in ms of the intersection of two unions, clipped to [lo, hi)."""
    both = union_ms(a, lo, hi) + union_ms(b, lo, hi)
    return both - union_ms(a + b, lo, hi)


@pytest.mark.slow
def test_fsdp2_units_and_counts_are_the_trace_s(exposed_run: Path) -> None:
    # GIVEN FSDP2 on 2 gloo ranks, fully_shard on 4 Linear layers (units "0".."3"), steps 2 and 3 recorded
    result = analyze_json(exposed_run)
    fsdp = result["fsdp"]
    assert fsdp["version"] == 2
    for rank in (0, 1):
        events = events_of(exposed_run, rank)
        steps = sorted((e for e in events if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])
        ops = [e for e in events if e["name"] in ("c10d::_allgather_base_", "c10d::_reduce_scatter_base_")]
        expected: dict[tuple[str, str], int] = {}
        for r in (
            e for e in events if e["name"].startswith(("FSDP::all_gather (", "FSDP::post_backward_reduce ("))
        ):
            kind = "all_gather" if r["name"].startswith("FSDP::all_gather") else "reduce_scatter"
            op = "c10d::_allgather_base_" if kind == "all_gather" else "c10d::_reduce_scatter_base_"
            unit = r["name"].split("(")[1].rstrip(")")
            n = sum(1 for o in ops if o["name"] == op and inside(r, o))
            expected[(unit, kind)] = expected.get((unit, kind), 0) + n
        (mine,) = [r for r in fsdp["ranks"] if r["rank"] == rank]
        # THEN its units are the modules the ranges name, each with the c10d ops inside its ranges, per step
        assert [u["unit"] for u in mine["units"]] == ["0", "1", "2", "3"]
        for unit in mine["units"]:
            assert unit["all_gathers_per_step"] == expected[(unit["unit"], "all_gather")] / len(steps) == 2
            assert unit["reduce_scatters_per_step"] == expected[(unit["unit"], "reduce_scatter")] / len(steps)
            assert unit["all_gather_bytes_per_step"] == 2 * (256 * 256 + 256) * 4 / 2  # its shard, twice
        assert mine["unattributed"] == 0
        gloo = [e for e in events if e["name"] == "gloo:all_gather"]
        main_tid = steps[0]["tid"]
        busy = [
            (e["ts"], e["ts"] + e["dur"]) for e in events if e["tid"] == main_tid and e["cat"] == "cpu_op"
        ]
        for row, span in zip(mine["steps"], steps, strict=True):
            lo, hi = span["ts"], span["ts"] + span["dur"]
            # and each step counts the all-gathers issued in it, times them as the gloo ranges' union
            assert row["all_gathers"] == sum(
                1 for o in ops if o["name"] == "c10d::_allgather_base_" and inside(span, o)
            )
            spans = [(e["ts"], e["ts"] + e["dur"]) for e in gloo]
            assert row["all_gather_ms"] == pytest.approx(union_ms(spans, lo, hi), abs=0.002)
            # and its exposed part is at most that, and at least what the training thread's ops leave of it
            hidden_at_most = overlap_ms(spans, busy, lo, hi)
            assert row["all_gather_ms"] - hidden_at_most - 0.002 <= row["exposed_all_gather_ms"]
            assert row["exposed_all_gather_ms"] <= row["all_gather_ms"]
            assert row["exposed_forward_ms"] + row["exposed_backward_ms"] == pytest.approx(
                row["exposed_all_gather_ms"], abs=0.003
            )


def exposed_share(result: dict[str, Any]) -> float:
    rows = [s for r in result["fsdp"]["ranks"] for s in r["steps"]]
    return sum(s["exposed_all_gather_ms"] for s in rows) / sum(s["all_gather_ms"] for s in rows)


@pytest.mark.slow
def test_exposed_all_gathers_raise_the_finding_and_prefetched_ones_show_less(
    exposed_run: Path, hidden_run: Path
) -> None:
    # GIVEN FSDP2 units that compute next to nothing and wait for every all-gather where it is issued
    result = analyze_json(exposed_run)
    # THEN nearly all of their all-gather time is exposed, and the finding prices it in step time
    assert exposed_share(result) > 0.9
    # (one finding for both ranks, or one per rank where their costs differ much)
    findings = [f for f in result["findings"] if f["id"] == FINDING]
    assert findings
    for found in findings:
        (rank,) = [r for r in result["fsdp"]["ranks"] if r["rank"] == found["rank"]]
        per_step = sorted(
            s["exposed_all_gather_ms"] for s in rank["steps"]
        )  # 2 steps: the median is the mean
        assert found["cost_ms_per_step"] == pytest.approx(sum(per_step) / len(per_step), abs=0.002)
        top = max(rank["units"], key=lambda u: u["exposed_all_gather_ms_per_step"])
        assert found["evidence"]["unit_1"] == top["unit"]
        assert f"`{top['unit']}`" in found["message"] and found["action"] in found["message"]
    # GIVEN the same units computing a batch of 2048, each prefetching the next unit's all-gather
    hidden = analyze_json(hidden_run)
    # THEN a smaller share of their all-gather time is exposed
    assert exposed_share(hidden) < exposed_share(result)


def fsdp1_trace(path: Path) -> Path:
    """FSDP1 on one NCCL rank, one step of 1000 us: unit 0 (100 elements per rank) and unit 1 (300)."""

    def fsdp(name: str, ts: float, dur: float) -> dict[str, Any]:
        return cpu(f"FullyShardedDataParallel.{name}", ts, dur, cat="user_annotation")

    def gather(ts: float, n: int, kernel_ts: float, dur: float, corr: int) -> list[dict[str, Any]]:
        args = {"Collective name": "_allgather_base", "In msg nelems": n, "Out msg nelems": 2 * n,
                "dtype": "Float", "Group size": 2}  # fmt: skip
        return [
            cpu("c10d::_allgather_base_", ts, 10),
            cpu("record_param_comms", ts + 1, 8, **args),
            *launched("ncclDevKernel_AllGather_RING_LL", ts + 2, kernel_ts, dur, corr, stream=20),
        ]

    def compute(ts: float, kernel_ts: float, dur: float, corr: int) -> list[dict[str, Any]]:
        return [cpu("aten::mm", ts, 3), *launched("volta_sgemm_128x64_nn", ts + 1, kernel_ts, dur, corr)]

    rs_args = {"Collective name": "_reduce_scatter_base", "In msg nelems": 600, "Out msg nelems": 300,
               "dtype": "Float", "Group size": 2}  # fmt: skip
    events = [
        step(1, 0, 1000),
        fsdp("_pre_forward", 10, 50),
        *gather(12, 100, 20, 40, 1),  # unit 0: 40 us, nothing computes
        *compute(61, 65, 35, 2),
        fsdp("_pre_forward", 100, 20),
        *gather(102, 300, 105, 50, 3),  # unit 1: 50 us, 30 of them under a matmul
        *compute(113, 115, 30, 4),
        fsdp("_pre_backward_hook", 300, 100),
        *gather(302, 300, 305, 40, 5),  # 300 elements: unit 1's; 40 us exposed
        fsdp("_pre_backward_prefetch", 320, 20),
        *gather(322, 100, 350, 30, 6),  # 100: unit 0's, hidden by the matmul below
        *compute(341, 345, 35, 7),
        fsdp("_post_backward_hook", 400, 50),
        cpu("c10d::_reduce_scatter_base_", 402, 10),
        cpu("record_param_comms", 403, 8, **rs_args),
        *launched("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", 404, 405, 20, 8, stream=20),
    ]
    return write_trace(path, events)


def test_fsdp1_units_by_forward_order_and_message_size(tmp_path: Path) -> None:
    # GIVEN an FSDP1 rank whose ranges name no module: two units, each gathered in forward and in backward
    result = analyze_json(fsdp1_trace(tmp_path / "fsdp1.json"))
    (rank,) = result["fsdp"]["ranks"]
    assert result["fsdp"]["version"] == rank["version"] == 1
    # THEN the units are numbered in forward order; backward collectives find theirs by message size
    units = {u["unit"]: u for u in rank["units"]}
    assert list(units) == ["unit 0", "unit 1"]
    assert units["unit 0"]["all_gathers_per_step"] == units["unit 1"]["all_gathers_per_step"] == 2
    assert units["unit 0"]["all_gather_bytes_per_step"] == 2 * 100 * 4
    assert units["unit 1"]["reduce_scatters_per_step"] == 1
    assert units["unit 1"]["reduce_scatter_bytes_per_step"] == 600 * 4
    assert units["unit 0"]["reduce_scatters_per_step"] == 0
    assert rank["unattributed"] == 0
    # AND exposed is the all-gather time no computation kernel runs under: 40 + 20 us in forward, 40 in backward
    assert units["unit 0"]["exposed_all_gather_ms_per_step"] == 0.04
    assert units["unit 1"]["exposed_all_gather_ms_per_step"] == 0.06
    (row,) = rank["steps"]
    assert (row["all_gathers"], row["reduce_scatters"], row["all_gather_ms"]) == (4, 1, 0.16)
    assert (row["exposed_all_gather_ms"], row["exposed_forward_ms"], row["exposed_backward_ms"]) == (
        0.1,
        0.06,
        0.04,
    )
    # AND the finding prices the 100 us per 1000 us step, names the units and, the time being in forward,
    # says to prefetch
    (found,) = [f for f in result["findings"] if f["id"] == FINDING]
    assert (found["cost_ms_per_step"], found["pct_of_step"]) == (0.1, 10.0)
    assert found["evidence"]["unit_1"] == "unit 1" and found["evidence"]["unit_2"] == "unit 0"
    assert "forward_prefetch=True" in found["action"]
    # AND the terminal shows the units' table
    from click.testing import CliRunner

    from stepscope.cli import cli

    text = CliRunner().invoke(cli, ["analyze", str(tmp_path / "fsdp1.json")], terminal_width=140).output
    table = text[text.index("FSDP units") :]
    assert "unit 1" in table and "exposed" in table and "60.0 us" in table


def test_no_fsdp_is_null(tmp_path: Path) -> None:
    # GIVEN a trace without FSDP ranges THEN analyze --json's fsdp is null and no FSDP finding is raised
    path = write_trace(tmp_path / "plain.json", [step(1, 0, 100), *launched("volta_sgemm", 1, 5, 50, 1)])
    result = analyze_json(path)
    assert result["fsdp"] is None
    assert all(f["id"] != FINDING for f in result["findings"])


def test_exposed_communication_on_cpu_is_the_time_the_training_thread_does_not_compute(
    tmp_path: Path,
) -> None:
    from stepscope.analysis import intervals as iv
    from stepscope.analysis.per_rank import exposed_communication, prepare_rank
    from stepscope.analysis.per_rank.comm.collectives import communication_intervals

    from ..support.traces import load

    # GIVEN a gloo rank: an all-gather on gloo's thread for 100 us; meanwhile the training thread runs a matmul
    # (20 us), then an autograd node whose hook issues the next collective and waits (50 us), the node's own
    # matmul inside it (10 us); gloo copies on its own thread
    events = [
        step(1, 0, 200),
        cpu("gloo:all_gather", 0, 100, cat="user_annotation", tid=2),
        cpu("aten::copy_", 5, 90, tid=2),
        cpu("aten::mm", 10, 20),
        cpu("autograd::engine::evaluate_function: AddmmBackward0", 40, 50),
        cpu("c10d::_allgather_base_", 41, 4),
        cpu("AddmmBackward0", 50, 10),
        cpu("aten::mm", 51, 8),
    ]
    data = prepare_rank(load(write_trace(tmp_path / "gloo.json", events)), 0)
    comm = communication_intervals(data)
    assert comm is not None
    # THEN the exposed part is the all-gather less the two matmuls' ops: 100 - 20 - 10 us
    assert iv.length(exposed_communication(data, comm)) == 70_000
