"""Temporal breakdown, kernel types, overlap, idle per stream, top kernels and the step table on a synthetic trace
whose every number is worked out by hand in the comments."""

from __future__ import annotations

import numpy as np
import pytest

from stepscope.analysis.analyze import SCHEMA, analyze
from stepscope.analysis.per_rank.breakdown import KernelTypeCombo, KernelTypeStat, Temporal
from stepscope.analysis.per_rank.idle import StreamIdle
from stepscope.analysis.per_rank.overlap import CommOverlap

from ..support.synthetic import NCCL, T0, two_step_trace
from ..support.traces import cpu, kernel, launched, runtime, step, table_of


def test_temporal_breakdown_whole_window() -> None:
    # GIVEN both steps in the window
    result = analyze(table_of({0: two_step_trace()}))
    # THEN span = 1400-100 = 1300; union of GPU = 350+50+40+100+300 = 840 -> idle 460;
    # compute = 300+40+100+200 = 640; non-compute = 840-640 = 200 (exposed comm 150 + memcpy 50)
    (rank,) = result.ranks
    assert result.schema == SCHEMA
    assert rank.temporal == Temporal(
        span_us=1300.0,
        idle_us=460.0,
        compute_us=640.0,
        non_compute_us=200.0,
        idle_pct=35.385,
        compute_pct=49.231,
        non_compute_pct=15.385,
    )


def test_kernel_types_and_overlap() -> None:
    rank = analyze(table_of({0: two_step_trace()})).ranks[0]
    assert rank.kernel_types is not None
    assert rank.kernel_types.by_type == [
        KernelTypeStat("computation", 5, 640.0, 640.0, 49.231),
        KernelTypeStat("communication", 2, 400.0, 400.0, 30.769),
        KernelTypeStat("memory", 1, 50.0, 50.0, 3.846),
    ]
    # exclusive time of each combination, as % of the 840 us the GPU is busy
    assert rank.kernel_types.combos == [
        KernelTypeCombo(["computation"], 390.0, 46.429),
        KernelTypeCombo(["computation", "communication"], 250.0, 29.762),
        KernelTypeCombo(["communication"], 150.0, 17.857),
        KernelTypeCombo(["memory"], 50.0, 5.952),
    ]
    # comm [250,450)+[1200,1400) = 400 us; overlapped by compute [250,400)+[1200,1300) = 250 us
    assert rank.communication == CommOverlap(
        comm_us=400.0, overlapped_us=250.0, exposed_us=150.0, overlap_pct=62.5
    )
    assert rank.overlap_pct == 62.5


def test_idle_by_stream() -> None:
    rank = analyze(table_of({0: two_step_trace()})).ranks[0]
    assert rank.idle_by_stream == [
        # gaps 0 (kernel wait), 200 (host), 10 (kernel wait), 100 (other), 200 (host)
        StreamIdle(
            0, 7, 6, busy_us=690.0, idle_us=510.0, host_wait_us=400.0, kernel_wait_us=10.0, other_us=100.0
        ),
        # one gap of 750 us; the second NCCL kernel was launched after the first ended
        StreamIdle(
            0, 20, 2, busy_us=400.0, idle_us=750.0, host_wait_us=750.0, kernel_wait_us=0.0, other_us=0.0
        ),
    ]


def test_top_kernels() -> None:
    rank = analyze(table_of({0: two_step_trace()}), top=3).ranks[0]
    # of 1090 us of summed GPU time
    assert [(k.name, k.count, k.total_us, k.pct) for k in rank.top_kernels] == [
        ("gemm_A", 2, 400.0, 36.697),
        (NCCL, 2, 400.0, 36.697),
        ("elementwise_B", 1, 100.0, 9.174),
    ]


def test_step_table() -> None:
    rank = analyze(table_of({0: two_step_trace()})).ranks[0]
    s1, s2 = rank.steps
    assert (s1.step, s1.start_us, s1.dur_us, s2.step, s2.start_us) == (1, 0.0, 1000.0, 2, 1000.0)
    # GPU busy inside step 1's wall time: 350+50+40+100 = 540 of 1000; step 2: 300
    assert (s1.gpu_busy_pct, s2.gpu_busy_pct) == (54.0, 30.0)
    assert (s1.comm_us, s2.comm_us) == (200.0, 200.0)
    assert (s1.kernels, s2.kernels) == (6, 2)
    # forward: [5,200) (the nested annotation is inside it); the python frame and aten op are not regions
    assert (s1.dataloader_us, s1.forward_us, s1.backward_us, s1.optimizer_us) == (5.0, 195.0, 400.0, 100.0)
    assert (s2.dataloader_us, s2.forward_us, s2.backward_us, s2.optimizer_us) == (0.0, 0.0, 0.0, 0.0)


def test_drop_last_step_narrows_the_window() -> None:
    # GIVEN the last step dropped: only GPU work launched during step 1 counts
    rank = analyze(table_of({0: two_step_trace()}), drop_last_step=True).ranks[0]
    # THEN span 100..900 = 800, busy 540, compute 300+40+100 = 440, non-compute 100
    assert rank.temporal == Temporal(800.0, 260.0, 440.0, 100.0, 32.5, 55.0, 12.5)
    assert (rank.window.steps, rank.window.total_steps, rank.window.dropped_last_step) == (1, 2, True)
    assert [s.step for s in rank.steps] == [1]
    assert rank.overlap_pct == 75.0  # comm [250,450) overlapped by [250,400)


def test_gpu_work_is_placed_by_its_launch() -> None:
    # GIVEN a kernel launched in step 1 that runs after step 1 ended, and one launched before the first step
    t = T0
    ev = [step(1, t, 100), step(2, t + 100, 100)]
    ev += launched("late", t + 90, t + 150, 10, 1)
    ev += launched("early", t - 50, t - 40, 10, 2)
    rank = analyze(table_of({0: ev}), drop_last_step=True).ranks[0]
    # THEN only the late kernel belongs to the window
    assert [k.name for k in rank.top_kernels] == ["late"]


def test_kernel_without_launch_record_uses_its_own_start() -> None:
    t = T0
    ev = [step(1, t, 100), kernel("orphan", t + 10, 20), kernel("outside", t + 500, 20)]
    rank = analyze(table_of({0: ev})).ranks[0]
    assert [k.name for k in rank.top_kernels] == ["orphan"]


def test_no_steps_uses_the_whole_trace() -> None:
    t = T0
    ev = [*launched("k", t, t + 10, 10, 1), *launched("k", t + 20, t + 40, 10, 2)]
    rank = analyze(table_of({0: ev})).ranks[0]
    assert rank.temporal == Temporal(40.0, 20.0, 20.0, 0.0, 50.0, 50.0, 0.0)
    assert rank.steps == []
    assert rank.window.total_steps == 0
    assert any("no ProfilerStep" in n for n in rank.notes)


def test_no_communication_gives_null_overlap() -> None:
    ev = [step(1, T0, 100), *launched("k", T0 + 1, T0 + 10, 10, 1)]
    rank = analyze(table_of({0: ev})).ranks[0]
    assert rank.overlap_pct is None and rank.communication is None


@pytest.mark.parametrize(
    "name",
    [
        "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t",
        "ncclDevKernel_Generic_4",
        "void deep_ep::intranode::dispatch<8, 768, 6144>(int4*, float*)",
        "void deep_ep::internode_ll::combine<false, 7168>(void*)",
        "void c10d::symmetric_memory::one_shot_all_reduce_kernel<float, 8>(float**)",
        "multimem_all_reduce_kernel",
        "void vllm::cross_device_reduce_1stage<half, 8>(vllm::RankData*)",
        "rcclGenericKernel<1, false>",
        "nvshmemi_transfer_rma_kernel",
        "NCCL_AllReduce_Custom",  # names are matched case-insensitively
        "myAllGatherKernel",
    ],
)
def test_communication_kernels_beyond_nccl(name: str) -> None:
    ev = [step(1, T0, 100), *launched(name, T0 + 1, T0 + 10, 10, 1)]
    kinds = analyze(table_of({0: ev})).ranks[0].kernel_types
    assert kinds is not None and kinds.by_type[1].count == 1


@pytest.mark.parametrize(
    "name", ["void at::native::reduce_kernel<512, 1>", "ampere_sgemm_128x64_tn", "triton_poi_fused_gather_0"]
)
def test_compute_kernels_are_not_communication(name: str) -> None:
    ev = [step(1, T0, 100), *launched(name, T0 + 1, T0 + 10, 10, 1)]
    kinds = analyze(table_of({0: ev})).ranks[0].kernel_types
    assert kinds is not None and kinds.by_type[0].count == 1


def test_cpu_only_trace_has_a_step_table_and_no_gpu_sections() -> None:
    # GIVEN a CPU-only trace without rank information (HTA crashes on these)
    ev = [step(7, T0, 100), cpu("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", T0, 30)]
    ev.append(runtime("cudaGetDevice", T0 + 40, 1, -1))
    result = analyze(table_of({0: ev}))
    rank = result.ranks[0]
    assert rank.temporal is None and rank.kernel_types is None and rank.idle_by_stream == []
    assert rank.overlap_pct is None and rank.top_kernels == []
    assert [(s.step, s.dur_us, s.gpu_busy_pct, s.dataloader_us) for s in rank.steps] == [
        (7, 100.0, None, 30.0)
    ]
    # the 70 us outside any op cost more than the 30 us of loading; the breakdown comes last
    assert [f.id for f in result.findings] == ["python_overhead", "data_loader_stall", "step_breakdown"]


def test_names_are_classified_once_per_load_and_only_where_used() -> None:
    # GIVEN two ranks sharing one symbol table, with a CPU-side name that looks like a collective
    ev = [step(1, T0, 100), cpu("nccl:all_reduce", T0 + 1, 5, cat="user_annotation")]
    table = table_of(
        {
            0: [*ev, *launched(NCCL, T0 + 2, T0 + 10, 10, 1)],
            1: [*ev, *launched("gemm", T0 + 2, T0 + 10, 10, 1)],
        }
    )
    asked: list[str] = []

    def is_comm(name: str) -> bool:
        asked.append(name)
        return "nccl" in name.lower()

    kernel_names = table.columns["name"][table.cat_mask("kernel")]
    # WHEN both ranks' tables ask about the names of their kernels under one key
    masks = [
        table.select(table.columns["rank"] == r).names_matching(is_comm, key="comm", among=kernel_names)
        for r in (0, 1)
    ]
    # THEN each kernel name was evaluated once, CPU-side names never, and the answers are right
    assert sorted(asked) == sorted([NCCL, "gemm"])
    assert [table.names[i] for i in np.flatnonzero(masks[1])] == [NCCL]
    # AND without a key nothing is cached
    table.names_matching(is_comm)
    assert len(asked) == 2 + len(table.names)
