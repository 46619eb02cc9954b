"""Findings: each rule fires on a synthetic trace built to show it (with exact evidence) and stays quiet otherwise."""

from __future__ import annotations

import msgspec
import pytest

from stepscope.analysis.analyze import analyze
from stepscope.analysis.findings.rules import Finding

from ..support.synthetic import LOADER, T0, rank_trace, two_step_trace
from ..support.traces import cpu, launched, runtime, step, table_of


def loader_trace(
    loader_us: float, *, launch_at: float | None = None, start_at: float | None = None
) -> list[dict]:
    """Three 1000 us steps; each waits `loader_us` on the DataLoader, then launches one kernel (2 us after the
    loader, unless `launch_at`) that starts 5 us after the loader (unless `start_at`) and runs to the step's end."""
    ev: list[dict] = []
    for i in range(3):
        t = T0 + 1000 * i
        launch = loader_us + 2 if launch_at is None else launch_at
        start = loader_us + 5 if start_at is None else start_at
        ev.append(step(i + 1, t, 1000))
        ev.append(cpu(LOADER, t, loader_us, cat="user_annotation"))
        ev += launched("conv", t + launch, t + start, 1000 - start, i + 1)
    return ev


def findings_of(events_by_rank: dict[int, list[dict]]) -> list[Finding]:
    return analyze(table_of(events_by_rank)).findings


def by_id(findings: list[Finding], id_: str) -> Finding:
    (found,) = [f for f in findings if f.id == id_]
    return found


def test_loader_stall_is_priced_by_the_gpu_idle_time_it_causes() -> None:
    # GIVEN 400 of every 1000 us spent in the DataLoader while the GPU has nothing to do
    (finding,) = findings_of({0: loader_trace(400)})
    # THEN the step loses those 400 us (the 5 us launch gap after it is under the 10 us floor)
    assert (finding.id, finding.severity, finding.rank) == ("data_loader_stall", "high", 0)
    assert (finding.cost_ms_per_step, finding.pct_of_step) == (0.4, 40.0)
    assert finding.evidence["dataloader_ms_per_step"] == 0.4
    assert finding.evidence["gpu_idle_during_loader_ms_per_step"] == 0.4
    assert finding.evidence["loader"] == LOADER
    assert (
        "per step: 0.400, 0.400, 0.400 ms; at least 5% of the step in 3 of 3 step(s); median 0.400 ms"
        in str(finding.evidence["arithmetic"])
    )
    assert "400 us per step (40.0% of the step)" in finding.message and LOADER in finding.message
    assert "num_workers" in finding.action and finding.action in finding.message


def test_short_loader_waits_are_not_a_stall() -> None:
    assert findings_of({0: loader_trace(20)}) == []


def test_loader_time_hidden_behind_gpu_work_costs_only_its_idle_part() -> None:
    # GIVEN the same 400 us of loading, but the GPU already runs queued work from 100 us on
    (finding,) = findings_of({0: loader_trace(400, launch_at=50, start_at=100)})
    # THEN only the first 100 us of each step cost anything; the host wait before them is the loader's
    assert (finding.id, finding.cost_ms_per_step, finding.severity) == ("data_loader_stall", 0.1, "medium")
    assert finding.evidence["dataloader_ms_per_step"] == 0.4


def test_launch_bound() -> None:
    # GIVEN 20 kernels of 5 us, each launched 45 us after the previous one finished
    ev = [step(1, T0, 1000)]
    for i in range(20):
        ev += launched("small", T0 + 50 * i + 10, T0 + 50 * i + 20, 5, i + 1)
    (finding,) = findings_of({0: ev})
    assert (finding.id, finding.severity) == ("launch_bound", "high")
    # idle: 20 us before the first kernel, 19 gaps of 45 us, 25 us after the last = 900 us, all host waits
    assert (finding.cost_ms_per_step, finding.pct_of_step) == (0.9, 90.0)
    assert {k: v for k, v in finding.evidence.items() if k != "arithmetic"} == {
        "gpu_waits_per_step": 21.0,
        "mean_wait_us": 42.857,
        "kernels_per_step": 20.0,
        "mean_kernel_us": 5.0,
        "short_kernel_pct": 100.0,
    }


def test_host_bound_names_the_phase_and_the_op_that_hold_the_gpu() -> None:
    # GIVEN 12 kernels of 50 us, each launched 10 us after the previous one finished, then a 750 us optimizer
    # step whose _foreach_mul_ keeps the CPU busy while the GPU has nothing to do
    ev = [step(1, T0, 2000)]
    for i in range(12):
        ev += launched("gemm", T0 + 100 * i + 60, T0 + 100 * i + 100, 50, i + 1)
    ev.append(cpu("Optimizer.step#SGD.step", T0 + 1250, 750, cat="user_annotation"))
    ev.append(cpu("aten::_foreach_mul_", T0 + 1260, 730))
    (finding,) = findings_of({0: ev})
    # THEN idle = 100 before the first kernel + 11 x 50 between them + 750 after = 1400 us, all host waits
    assert (finding.id, finding.severity, finding.cost_ms_per_step) == ("host_bound", "high", 1.4)
    assert finding.evidence["phase"] == "optimizer"
    assert finding.evidence["optimizer_ms_per_step"] == 0.75
    assert finding.evidence["optimizer_top_op"] == "aten::_foreach_mul_"
    assert finding.evidence["other_ms_per_step"] == 0.65
    assert "in optimizer for 750 us of it (mostly `aten::_foreach_mul_`, 730 us per call)" in finding.message
    assert "fused optimizer" in finding.action


def test_tiny_kernels_queued_ahead_are_tiny_but_not_launch_bound() -> None:
    # GIVEN 150 kernels of 2 us, all queued at once, 1 us apart on the GPU (kernel wait, not host wait)
    ev = [step(1, T0, 455)]
    for i in range(150):
        ev += launched("vectorized_add", T0 + 1, T0 + 2 + 3 * i, 2, i + 1)
    (finding,) = findings_of({0: ev})
    # THEN the 149 us of launch latency between them is the price (32.7% of the 455 us step)
    assert (finding.id, finding.severity, finding.cost_ms_per_step) == ("tiny_kernels", "high", 0.149)
    assert {k: v for k, v in finding.evidence.items() if k != "arithmetic"} == {
        "tiny_kernels": 150,
        "kernels": 150,
        "tiny_pct": 100.0,
        "tiny_total_ms_per_step": 0.3,
        "most_frequent": "vectorized_add",
        "most_frequent_count": 150,
    }


def test_comm_bound() -> None:
    ev = [step(1, T0, 520), *launched("gemm", T0 + 1, T0 + 10, 100, 1)]
    ev += launched("ncclDevKernel_AllGather_RING_LL", T0 + 2, T0 + 110, 400, 2, stream=20)
    finding = by_id(findings_of({0: ev}), "comm_bound")
    # the rule prices the 400 us of exposed communication (77% of the step), but the host's step lasts 520 us
    # whatever the GPU does: a replay without the collective ends the step no sooner, so it is LOW and says why
    assert (finding.severity, finding.cost_ms_per_step, finding.saving_ms_per_step) == ("low", 0.4, 0.0)
    assert finding.evidence["overlap_pct"] == 0.0 and finding.evidence["exposed_ms"] == 0.4
    assert "HIGH by its price, LOW by what fixing it saves: a replay of the rank's steps without it" in (
        finding.message
    )


def test_sync_points_cost_only_the_gpu_idle_time_after_them() -> None:
    t = T0
    ev = [
        step(1, t, 1000),
        *launched("gemm_a", t + 5, t + 6, 294, 1),
        # drains the GPU at 300: the GPU then idles until the next launch, 209 us later
        runtime("cudaDeviceSynchronize", t + 20, 281, 2),
        *launched("gemm_b", t + 500, t + 510, 490, 3),
        # while gemm_b runs: these wait for work already queued and cost nothing
        runtime("cudaStreamSynchronize", t + 600, 5, 4),
        cpu("aten::item", t + 699, 32),
        cpu("aten::_local_scalar_dense", t + 700, 30),
        runtime("cudaMemcpyAsync", t + 705, 1, 5),
    ]
    (finding,) = findings_of({0: ev})
    assert (finding.id, finding.severity, finding.cost_ms_per_step) == ("sync_points", "high", 0.209)
    assert {k: v for k, v in finding.evidence.items() if k != "arithmetic"} == {
        "syncs": 3,
        "syncs_leaving_gpu_idle": 1,
        "device_synchronize": 1,
        "stream_synchronize": 1,
        "event_synchronize": 0,
        "item_syncs": 1,
        "blocked_ms_per_step": 0.316,
        "op": "cudaDeviceSynchronize",
    }
    assert finding.message.startswith("1 of the 3 host synchronisations leave the GPU idle")


def test_a_sync_without_gpu_work_is_no_finding() -> None:
    ev = [step(1, T0, 1000), runtime("cudaDeviceSynchronize", T0 + 100, 50, 1)]
    assert "sync_points" not in [f.id for f in findings_of({0: ev})]


def test_findings_of_the_breakdown_trace_are_ranked_by_cost() -> None:
    findings = findings_of({0: two_step_trace()})
    # host waits: 100 (start) + 150 (before the memcpy) + 200 (before E) + 600 (after the last activity) = 1050
    # us over 2 steps, less the 5 us of data loading at the start (the loader's own, too small to report): 445
    # and 600 us, median 522.5; the pageable copy: 50 us in step 1, none in step 2, so in 1 of 2 steps only
    # (LOW, priced by the median: 25 us); exposed communication: 50 us in step 1, 100 us (10%, comm_bound's
    # threshold) in step 2, but 7.5% of the window: no comm_bound
    assert [(f.id, f.severity, f.cost_ms_per_step) for f in findings] == [
        ("host_bound", "high", 0.522),
        ("pageable_copies", "low", 0.025),
    ]
    assert (findings[1].steps_held, findings[1].steps) == (1, 2)
    assert "in 1 of 2 steps only (the median step: 25.0 us" in findings[1].message
    host = findings[0]
    assert host.evidence["phase"] == "other"
    assert host.evidence["other_ms_per_step"] == 0.4 and host.evidence["backward_ms_per_step"] == 0.075
    assert findings[1].evidence == {
        "copies": 1,
        "bytes": 4096,
        "arithmetic": findings[1].evidence["arithmetic"],
    }


def test_the_rank_that_arrives_last_is_the_straggler_with_its_cause() -> None:
    # GIVEN rank 1 loads 4 ms per step, ranks 0 and 2 1 ms, over 8 steps; rank 2's clock runs 5 s ahead
    table = table_of(
        {
            0: rank_trace(1000, steps=8),
            1: rank_trace(4000, steps=8),
            2: rank_trace(1000, shift_us=5e6, steps=8),
        }
    )
    result = analyze(table)
    # THEN the clocks are aligned on the collectives ...
    assert [r.clock_offset_us for r in result.ranks] == [0.0, 0.0, 5_000_000.0]
    assert result.cross_rank is not None and result.cross_rank.alignment is not None
    assert result.cross_rank.alignment.matched == 8 and result.cross_rank.alignment.end_spread_max_us == 0.0
    # ... ranks 0 and 2 wait 3 ms per step for rank 1, which waits for nobody
    waits = {r.rank: (r.comm_wait_us, r.transfer_us, r.last_arrivals) for r in result.cross_rank.ranks}
    assert waits == {0: (3000.0, 4350.0, 0), 1: (0.0, 4350.0, 8), 2: (3000.0, 4350.0, 0)}
    # ... and rank 1 is the straggler, for its data loading
    straggler = result.straggler
    assert straggler is not None and (straggler.rank, straggler.delay_ms_per_step) == (1, 3.0)
    assert straggler.cause is not None and straggler.cause.phase == "data_loader"
    assert (straggler.cause.rank_ms_per_step, straggler.cause.others_ms_per_step) == (4.0, 1.0)
    (finding,) = [f for f in result.findings if f.id == "straggler"]
    assert (finding.rank, finding.severity, finding.evidence["cause"]) == (1, "high", "data_loader")
    assert "data loading" in finding.message and "DataLoader" in finding.message


def test_two_collectives_are_too_few_to_name_a_straggler() -> None:
    # GIVEN the same job over 2 steps: rank 1 last at both collectives, as jitter would make it with chance 1/9
    table = table_of(
        {0: rank_trace(1000, steps=2), 1: rank_trace(4000, steps=2), 2: rank_trace(1000, steps=2)}
    )
    result = analyze(table)
    # THEN no straggler is named, and the group's waiting says why
    assert result.straggler is None and "straggler" not in [f.id for f in result.findings]
    (group,) = result.waiting_by_group
    assert (group.verdict, group.instances, group.waiting_ms_per_step) == ("no consistent straggler", 2, 3.0)
    assert "too few to tell a late rank from jitter" in group.note
    assert [(w.rank, w.share_pct, w.last_at) for w in group.waited_for] == [(1, 100.0, 2)]


def test_three_steps_late_alike_name_a_straggler_by_the_size_of_its_lateness() -> None:
    # GIVEN the job over 3 steps: rank 1 is last at each of the 3 collectives (jitter: chance 1/27, too common to
    # tell), but late by the same 3 ms in every step, which jitter that moves the order does not do
    table = table_of({0: rank_trace(1000), 1: rank_trace(4000), 2: rank_trace(1000)})
    result = analyze(table)
    # THEN the magnitude test names it
    assert result.straggler is not None and result.straggler.rank == 1
    (group,) = result.waiting_by_group
    assert group.verdict == "stragglers"


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
    # (MEDIUM by its price; the host holds the step to 1100 us, so a replay without it saves nothing: LOW)
    assert (finding.id, finding.severity, finding.cost_ms_per_step) == ("poor_overlap", "low", 0.08)
    assert finding.evidence["overlap_pct"] == 20.0
    assert finding.evidence["comm_pct_of_span"] == pytest.approx(100 / 1070 * 100, abs=0.001)


def slow_collective_trace() -> list[dict]:
    """Four 4 MiB all-reduces of 100 us and a fifth of the same size taking 50 ms, in one 60 ms step."""
    kernel_name = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
    args = {"Collective name": "allreduce", "In msg nelems": 1 << 20, "dtype": "Float", "Group size": 2}
    ev = [step(1, T0, 60_000)]
    for i, dur in enumerate([100, 100, 100, 100, 50_000]):
        t = T0 + 1000 * i
        ev += launched(kernel_name, t, t + 10, dur, i + 1, stream=20, **args)
    return ev


def test_collective_slow_names_the_instance_500x_slower() -> None:
    # GIVEN both ranks of a group run the same five all-reduces, arriving together: the fifth takes 50 ms
    (finding,) = [
        f
        for f in findings_of({0: slow_collective_trace(), 1: slow_collective_trace()})
        if f.id == "collective_slow"
    ]
    # THEN it is one finding on both ranks
    assert (finding.rank, finding.ranks, finding.severity) == (0, [0, 1], "high")
    assert finding.cost_range_ms_per_step == [finding.cost_ms_per_step] * 2
    assert finding.evidence["slow_instances"] == 1 and finding.evidence["kind"] == "all_reduce"
    # 4 MiB in 100 us = 41.9 GB/s; in 50 ms, 500x less; the time lost is 50 ms less what 41.9 GB/s needs
    assert finding.evidence["reference_gbps"] == pytest.approx(41.943, abs=0.01)
    assert finding.evidence["slowest_gbps"] == pytest.approx(0.0839, abs=1e-3)
    assert finding.cost_ms_per_step == pytest.approx(49.9, abs=0.01)
    assert "500x slower" in finding.message


def test_a_slow_collective_on_one_traced_rank_of_two_may_be_waiting() -> None:
    # GIVEN the same all-reduces, but only rank 0 of the 2 traced: the 50 ms one may wait for rank 1
    findings = findings_of({0: slow_collective_trace()})
    # THEN no link is blamed
    assert "collective_slow" not in [f.id for f in findings]


def test_a_phase_the_trace_never_annotates_is_null_in_the_breakdown() -> None:
    # GIVEN CPU-only steps of 1000 us that annotate the backward pass and the optimizer, no forward, no loader
    ev: list[dict] = []
    for i in range(3):
        t = T0 + 1000 * i
        ev += [
            step(i + 1, t, 1000),
            cpu("aten::mm", t + 10, 300),
            cpu("## backward ##", t + 400, 400, cat="user_annotation"),
            cpu("Optimizer.step#SGD.step", t + 850, 100, cat="user_annotation"),
        ]
    result = analyze(table_of({0: ev}))
    breakdown = by_id(result.findings, "step_breakdown")
    # THEN the forward and the loader are unknown (null), not 0; the annotated phases have their time
    evidence = breakdown.evidence
    assert evidence["forward_ms_per_step"] is None and evidence["data_loader_ms_per_step"] is None
    assert (evidence["backward_ms_per_step"], evidence["optimizer_ms_per_step"]) == (0.4, 0.1)
    assert (evidence["other_ms_per_step"], evidence["step_ms"], evidence["steps"]) == (0.5, 1.0, 3)
    assert '"forward_ms_per_step":null' in msgspec.json.encode(result).decode()
    assert "does not annotate data loading and forward: that time is in other code" in breakdown.message


def test_a_finding_on_ranks_at_a_similar_cost_is_one_finding() -> None:
    # GIVEN the DataLoader costs 400 us per 1000 us step on rank 0, 300 us on rank 1 and 100 us on rank 2
    result = analyze(table_of({0: loader_trace(400), 1: loader_trace(300), 2: loader_trace(100)}))
    stalls = [f for f in result.findings if f.id == "data_loader_stall"]
    # THEN ranks 0 and 1 (the cheaper at least half the costlier) are one finding, rank 0's, with the spread;
    # rank 2, four times cheaper, keeps its own
    assert [(f.rank, f.ranks, f.cost_ms_per_step, f.cost_range_ms_per_step) for f in stalls] == [
        (0, [0, 1], 0.4, [0.3, 0.4]),
        (2, [2], 0.1, None),
    ]
    assert stalls[0].severity == "high" and "400 us per step" in stalls[0].message
