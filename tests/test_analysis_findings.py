"""Findings: each rule fires on a synthetic trace built to show it (with exact evidence) and stays quiet otherwise."""

from __future__ import annotations

from stepscope.analysis.analyze import analyze
from stepscope.analysis.findings import Finding
from stepscope.analysis.stragglers import RankStepStat, Stragglers

from ._traces import cpu, launched, runtime, step, table_of
from .test_analysis_breakdown import T0, two_step_trace

LOADER = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"


def loader_trace(loader_us: float, kernel_start: float = 450, kernel_launch: float = 410) -> list[dict]:
    """Three 1000 us steps; each waits `loader_us` on the DataLoader, then runs one kernel ending at 950."""
    ev: list[dict] = []
    for i in range(3):
        t = T0 + 1000 * i
        ev.append(step(i + 1, t, 1000))
        ev.append(cpu(LOADER, t, loader_us, cat="user_annotation"))
        ev += launched("conv", t + kernel_launch, t + kernel_start, 950 - kernel_start, i + 1)
    return ev


def findings_of(events_by_rank: dict[int, list[dict]]) -> list[Finding]:
    return analyze(table_of(events_by_rank)).findings


def test_loader_stall_is_found_with_its_evidence() -> None:
    # GIVEN 400 of every 1000 us spent in the DataLoader while the GPU has nothing to do
    (finding,) = findings_of({0: loader_trace(400)})
    assert finding == Finding(
        id="data_loader_stall",
        severity="high",
        rank=0,
        message=finding.message,
        evidence={
            "dataloader_us": 1200.0,
            "dataloader_pct": 40.0,
            "dataloader_us_per_step": 400.0,
            "gpu_idle_during_loader_us": 1200.0,
            "gpu_idle_during_loader_pct": 100.0,
            "window_us": 3000.0,
        },
    )
    assert "DataLoader" in finding.message and "40.0%" in finding.message


def test_short_loader_waits_are_not_a_stall() -> None:
    assert findings_of({0: loader_trace(20)}) == []


def test_loader_time_hidden_behind_gpu_work_is_not_a_stall() -> None:
    # GIVEN the same 400 us of loading, but the GPU already runs queued work from 100 us on (idle 25% of it)
    assert findings_of({0: loader_trace(400, kernel_start=100, kernel_launch=50)}) == []


def test_launch_bound() -> None:
    # GIVEN 20 kernels of 5 us, each launched 45 us after the previous one finished
    ev = [step(1, T0, 1000)]
    for i in range(20):
        ev += launched("small", T0 + 50 * i + 10, T0 + 50 * i + 20, 5, i + 1)
    (finding,) = findings_of({0: ev})
    assert (finding.id, finding.severity) == ("launch_bound", "high")
    # span 20..975 = 955 us, busy 100 us; every gap is host wait
    assert finding.evidence == {
        "idle_pct": 89.529,
        "host_wait_pct_of_idle": 100.0,
        "kernels": 20,
        "short_kernel_pct": 100.0,
        "median_kernel_us": 5.0,
        "kernels_per_step": 20.0,
    }


def test_host_bound_when_kernels_are_long() -> None:
    # GIVEN 12 kernels of 50 us, each launched 50 us after the previous one finished
    ev = [step(1, T0, 2000)]
    for i in range(12):
        ev += launched("gemm", T0 + 100 * i + 60, T0 + 100 * i + 100, 50, i + 1)
    (finding,) = findings_of({0: ev})
    assert (finding.id, finding.severity) == ("host_bound", "medium")
    # span 100..1250 = 1150 us, busy 600 us
    assert finding.evidence == {
        "idle_pct": 47.826,
        "host_wait_pct_of_idle": 100.0,
        "kernels": 12,
        "short_kernel_pct": 0.0,
        "median_kernel_us": 50.0,
        "kernels_per_step": 12.0,
    }


def test_tiny_kernels_queued_ahead_are_tiny_but_not_launch_bound() -> None:
    # GIVEN 150 kernels of 2 us, all queued at once, 1 us apart on the GPU (kernel wait, not host wait)
    ev = [step(1, T0, 1000)]
    for i in range(150):
        ev += launched("vectorized_add", T0 + 1, T0 + 10 + 3 * i, 2, i + 1)
    (finding,) = findings_of({0: ev})
    assert (finding.id, finding.severity) == ("tiny_kernels", "medium")
    assert finding.evidence == {
        "tiny_kernels": 150,
        "kernels": 150,
        "tiny_pct": 100.0,
        "tiny_total_us": 300.0,
        "most_frequent": "vectorized_add",
        "most_frequent_count": 150,
    }


def test_communication_bound() -> None:
    ev = [step(1, T0, 1000), *launched("gemm", T0 + 1, T0 + 10, 100, 1)]
    ev += launched("ncclDevKernel_AllGather_RING_LL", T0 + 2, T0 + 110, 400, 2, stream=20)
    (finding,) = findings_of({0: ev})
    assert (finding.id, finding.severity) == ("communication_bound", "high")
    assert finding.evidence == {
        "comm_us": 400.0,
        "overlap_pct": 0.0,
        "exposed_us": 400.0,
        "exposed_pct_of_span": 80.0,
    }


def test_sync_points_count_explicit_and_item_syncs() -> None:
    t = T0
    ev = [
        step(1, t, 1000),
        runtime("cudaDeviceSynchronize", t + 100, 50, 1),
        runtime("cudaStreamSynchronize", t + 200, 10, 2),
        # loss.item(): the scalar copy happens inside _local_scalar_dense on the same thread
        cpu("aten::item", t + 299, 32),
        cpu("aten::_local_scalar_dense", t + 300, 30),
        runtime("cudaMemcpyAsync", t + 305, 1, 3),
        # a scalar op on another thread whose time range holds a copy of thread 1: not a sync of its own
        cpu("aten::_local_scalar_dense", t + 400, 10, tid=2),
        runtime("cudaMemcpyAsync", t + 402, 1, 4),
    ]
    finding, no_gpu = findings_of({0: ev})
    assert (finding.id, finding.severity, no_gpu.id) == ("sync_points", "medium", "no_gpu_activity")
    assert finding.evidence == {
        "device_synchronize": 1,
        "stream_synchronize": 1,
        "event_synchronize": 0,
        "item_syncs": 1,
        "blocked_us": 90.0,
        "blocked_pct": 9.0,
    }


def test_pageable_copies_and_comm_findings_of_the_breakdown_trace() -> None:
    findings = findings_of({0: two_step_trace()})
    assert [(f.id, f.severity) for f in findings] == [
        ("communication_bound", "medium"),
        ("pageable_copies", "low"),
    ]
    assert findings[0].evidence == {
        "comm_us": 400.0,
        "overlap_pct": 62.5,
        "exposed_us": 150.0,
        "exposed_pct_of_span": 11.538,
    }
    assert findings[1].evidence == {"copies": 1, "total_us": 50.0, "bytes": 4096, "pct_of_span": 3.846}


def rank_trace(step_us: float, comm_us: float) -> list[dict]:
    ev: list[dict] = []
    for i in range(2):
        t = T0 + 2000 * i
        ev.append(step(i + 1, t, step_us))
        ev += launched("gemm", t + 1, t + 10, step_us - comm_us - 20, 2 * i + 1)
        ev += launched(
            "ncclDevKernel_AllReduce", t + 2, t + step_us - comm_us - 10, comm_us, 2 * i + 2, stream=20
        )
    return ev


def test_stragglers_name_the_slowest_rank() -> None:
    # GIVEN rank 1's steps take 1200 us and rank 0's 1000 us; rank 0 waits longer in the all-reduce
    result = analyze(table_of({0: rank_trace(1000, 300), 1: rank_trace(1200, 100)}))
    assert result.stragglers == Stragglers(
        ranks=[RankStepStat(0, 2, 1000.0, 300.0), RankStepStat(1, 2, 1200.0, 100.0)],
        slowest_rank=1,
        fastest_rank=0,
        slowest_step_us=1200.0,
        fastest_step_us=1000.0,
        spread_us=200.0,
        spread_pct=20.0,
        least_comm_wait_rank=1,
    )
    (straggler,) = [f for f in result.findings if f.id == "straggler"]
    assert (straggler.rank, straggler.severity, straggler.evidence["spread_pct"]) == (1, "high", 20.0)


def test_single_rank_has_no_straggler_view() -> None:
    assert analyze(table_of({0: rank_trace(1000, 300)})).stragglers is None
