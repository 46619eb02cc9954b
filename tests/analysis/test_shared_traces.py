"""`analyze` on the real traces of ../shared/traces (skipped on a fresh clone without them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepscope.analysis.analyze import analyze

from ..support.traces import SHARED_TRACES, load

pytestmark = pytest.mark.shared


def shared(relative: str) -> Path:
    path = SHARED_TRACES / relative
    return path


def test_resnet_steps_show_data_loader_time() -> None:
    path = shared("kineto_resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz")
    rank = analyze(load(path)).ranks[0]
    assert [s.step for s in rank.steps] == [5, 6, 7, 8, 9, 10]
    assert all(s.dataloader_us is not None and s.dataloader_us > 0 for s in rank.steps)
    assert all(s.gpu_busy_pct is not None and 0 < s.gpu_busy_pct <= 100 for s in rank.steps)
    assert all(s.optimizer_us for s in rank.steps)  # Optimizer.step#SGD.step / zero_grad annotations


def test_two_ranks_of_one_job() -> None:
    result = analyze(load(shared("hta_trace_filter")), drop_last_step=True)
    assert [r.rank for r in result.ranks] == [0, 1]
    # agrees with HTA 0.5.0's temporal breakdown and overlap on this set (benchmarks/compare_hta.py)
    assert [r.temporal.idle_pct for r in result.ranks if r.temporal] == pytest.approx(
        [53.56, 54.72], abs=0.01
    )
    assert [r.overlap_pct for r in result.ranks] == pytest.approx([11.81, 20.05], abs=0.01)
    assert result.cross_rank is not None and result.cross_rank.slowest_rank in (0, 1)
    # the NCCL SendRecv kernels are launched inside c10d::alltoall_base_, allreduce_ and _allgather_base_:
    # the launching op names the collective (in the first of the two steps: --drop-last-step)
    kinds = [sorted((c.kind, c.count) for c in r.collectives) for r in result.ranks]
    assert kinds == [[("all_gather", 1), ("all_reduce", 2), ("all_to_all", 2)]] * 2
    # two of 128 ranks whose collectives, matched in order, do not end together: not trusted, no straggler
    assert result.straggler is None
    assert result.cross_rank is not None and result.cross_rank.alignment is not None
    assert result.cross_rank.alignment.method == "rejected"
    assert any("2 of 128 ranks loaded" in n for n in result.notices)
    assert any("do not end together" in n for n in result.notices)


@pytest.mark.parametrize(
    "relative",
    [
        "hta_cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
        "hta_rank_unavailable/rank_not_found.json.gz",
    ],
)
def test_cpu_only_traces_get_an_answer(relative: str) -> None:
    # HTA 0.5.0 raises IndexError on these; we report no GPU sections, a note and the CPU-side steps
    result = analyze(load(shared(relative)))
    (rank,) = result.ranks
    assert rank.temporal is None and rank.overlap_pct is None
    assert rank.steps and rank.steps[0].gpu_busy_pct is None
    (info,) = [f for f in result.findings if f.id == "step_breakdown"]
    # (each of these traces has one step: the breakdown splits that step, and says so)
    assert info.severity == "info" and info.message.startswith("No GPU activity: its one step (")
