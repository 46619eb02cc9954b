"""Findings: each rule fires on a synthetic trace built to show it (with exact evidence) and stays quiet otherwise."""

from __future__ import annotations

import pytest

from stepscope.analysis.analyze import analyze
from stepscope.analysis.findings import Finding

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


def test_comm_bound() -> None:
    ev = [step(1, T0, 1000), *launched("gemm", T0 + 1, T0 + 10, 100, 1)]
    ev += launched("ncclDevKernel_AllGather_RING_LL", T0 + 2, T0 + 110, 400, 2, stream=20)
    (finding,) = findings_of({0: ev})
    assert (finding.id, finding.severity) == ("comm_bound", "high")
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
        ("comm_bound", "medium"),
        ("pageable_copies", "low"),
    ]
    assert findings[0].evidence == {
        "comm_us": 400.0,
        "overlap_pct": 62.5,
        "exposed_us": 150.0,
        "exposed_pct_of_span": 11.538,
    }
    assert findings[1].evidence == {"copies": 1, "total_us": 50.0, "bytes": 4096, "pct_of_span": 3.846}


def rank_trace(loader_us: float, *, shift_us: float = 0.0, steps: int = 3) -> list[dict]:
    """One rank of a data-parallel job, 10 ms steps: the DataLoader for `loader_us`, a 1 ms GEMM, then an
    all-reduce that ends 9.5 ms into the step on every rank (the rank that loads longest arrives last).
    `shift_us` moves the rank's whole clock."""
    ev: list[dict] = []
    for i in range(steps):
        t = T0 + 10_000 * i + shift_us
        ev.append(step(i + 1, t, 10_000))
        ev.append(cpu(LOADER, t, loader_us, cat="user_annotation"))
        ev += launched("gemm", t + loader_us, t + loader_us + 5, 1000, 2 * i + 1)
        arrive = t + loader_us + 1150
        kernel = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
        ev += launched(kernel, arrive - 5, arrive, t + 9500 - arrive, 2 * i + 2, stream=20)
    return ev


def test_the_rank_that_arrives_last_is_the_straggler_with_its_cause() -> None:
    # GIVEN rank 1 loads 4 ms per step, ranks 0 and 2 1 ms; rank 2's clock runs 5 s ahead
    table = table_of({0: rank_trace(1000), 1: rank_trace(4000), 2: rank_trace(1000, shift_us=5_000_000)})
    result = analyze(table)
    # THEN the clocks are aligned on the collectives ...
    assert [r.clock_offset_us for r in result.ranks] == [0.0, 0.0, 5_000_000.0]
    assert result.cross_rank is not None and result.cross_rank.alignment is not None
    assert result.cross_rank.alignment.matched == 3 and result.cross_rank.alignment.end_spread_max_us == 0.0
    # ... ranks 0 and 2 wait 3 ms per step for rank 1, which waits for nobody
    waits = {r.rank: (r.comm_wait_us, r.transfer_us, r.last_arrivals) for r in result.cross_rank.ranks}
    assert waits == {0: (3000.0, 4350.0, 0), 1: (0.0, 4350.0, 3), 2: (3000.0, 4350.0, 0)}
    # ... and rank 1 is the straggler, for its data loading
    straggler = result.straggler
    assert straggler is not None and (straggler.rank, straggler.delay_ms_per_step) == (1, 3.0)
    assert straggler.cause is not None and straggler.cause.phase == "data_loader"
    assert (straggler.cause.rank_ms_per_step, straggler.cause.others_ms_per_step) == (4.0, 1.0)
    (finding,) = [f for f in result.findings if f.id == "straggler"]
    assert (finding.rank, finding.severity, finding.evidence["cause"]) == (1, "high", "data_loader")
    assert "data loading" in finding.message and "DataLoader" in finding.message


def test_equal_ranks_have_no_straggler() -> None:
    result = analyze(table_of({0: rank_trace(1000), 1: rank_trace(1000)}))
    assert result.straggler is None
    assert result.cross_rank is not None and result.cross_rank.spread_pct == 0.0
    assert "straggler" not in [f.id for f in result.findings]


def test_single_rank_has_no_cross_rank_view() -> None:
    result = analyze(table_of({0: rank_trace(1000)}))
    assert result.cross_rank is None and result.straggler is None
    assert result.ranks[0].clock_offset_us is None


def test_poor_overlap() -> None:
    # GIVEN 100 us of communication in a 1070 us span, 20 us of it under a GEMM: too little exposed for
    # comm_bound (80 us, 7.5% of the span), but poorly overlapped
    ev = [step(1, T0, 1100), *launched("gemm", T0 + 1, T0 + 10, 990, 1)]
    ev += launched("ncclDevKernel_AllReduce_Sum_f32_RING_LL", T0 + 2, T0 + 980, 100, 2, stream=20)
    (finding,) = [f for f in findings_of({0: ev}) if f.id in ("poor_overlap", "comm_bound")]
    assert (finding.id, finding.severity) == ("poor_overlap", "low")
    assert finding.evidence["overlap_pct"] == 20.0
    assert finding.evidence["comm_pct_of_span"] == pytest.approx(100 / 1070 * 100, abs=0.001)


def test_collective_slow_names_the_instance_500x_slower() -> None:
    # GIVEN four 4 MiB all-reduces of 100 us and a fifth of the same size taking 50 ms, in one 60 ms step
    kernel_name = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
    args = {"Collective name": "allreduce", "In msg nelems": 1 << 20, "dtype": "Float", "Group size": 2}
    ev = [step(1, T0, 60_000)]
    for i, dur in enumerate([100, 100, 100, 100, 50_000]):
        t = T0 + 1000 * i
        ev += launched(kernel_name, t, t + 10, dur, i + 1, stream=20, **args)
    (finding,) = [f for f in findings_of({0: ev}) if f.id == "collective_slow"]
    assert (finding.rank, finding.severity) == (0, "high")
    assert finding.evidence["slow_instances"] == 1 and finding.evidence["kind"] == "all_reduce"
    # 4 MiB in 100 us = 41.9 GB/s; in 50 ms, 500x less; the time lost is 50 ms less what 41.9 GB/s needs
    assert finding.evidence["reference_gbps"] == pytest.approx(41.943, abs=0.01)
    assert finding.evidence["slowest_gbps"] == pytest.approx(0.0839, abs=1e-3)
    assert finding.evidence["lost_ms_per_step"] == pytest.approx(49.9, abs=0.01)
    assert "500x slower" in finding.message
