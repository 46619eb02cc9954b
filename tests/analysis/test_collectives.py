"""Collectives from trace events: count, bytes and time per kind, without counting one collective twice."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from stepscope.analysis.per_rank.comm.collectives import rank_instances
from stepscope.analysis.per_rank.comm.stats import CollectiveStats, collective_stats
from stepscope.analysis.per_rank.comm_names import bus_factor, collective_kind, nccl_algorithm
from stepscope.analysis.per_rank.kernels import COMMUNICATION
from stepscope.analysis.per_rank.prepare import prepare_rank
from stepscope.analysis.read.loader import load_trace
from stepscope.analysis.read.table import TraceTable

from ..support.traces import table_of


def rank_collectives(table: TraceTable, rank: int) -> list[CollectiveStats]:
    return collective_stats(rank_instances(prepare_rank(table, rank)))


def ev(name: str, cat: str, dur: float, ts: float = 10, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "name": name, "cat": cat, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": args}


def summarize(events: list[dict[str, Any]]) -> list[CollectiveStats]:
    return rank_collectives(table_of({0: events}), 0)


def nccl_all_reduce(nelems: int, kernel_us: float, t: float = 10, corr: int = 1) -> list[dict[str, Any]]:
    """What one NCCL all-reduce leaves in a trace: c10d op, record_param_comms, backend range, the launch and
    the kernel (which newer torch gives the same args)."""
    comm_args = {
        "Collective name": "allreduce",
        "In msg nelems": nelems,
        "dtype": "BFloat16",
        "Group size": 8,
        "Process Group Name": "0",
    }
    kernel = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
    return [
        ev("c10d::allreduce_", "cpu_op", 30.0, ts=t),
        ev("record_param_comms", "cpu_op", 20.0, ts=t + 1, **comm_args),
        ev("nccl:all_reduce", "user_annotation", 10.0, ts=t + 2),
        ev("cudaLaunchKernel", "cuda_runtime", 5.0, ts=t + 3, correlation=corr),
        {**ev(kernel, "kernel", kernel_us, ts=t + 40, **comm_args, correlation=corr, stream=20, device=0)},
        ev("nccl:all_reduce", "gpu_user_annotation", kernel_us, ts=t + 40),
    ]


def test_each_collective_counts_once_with_bytes_device_time_and_bandwidth() -> None:
    events = nccl_all_reduce(1000, 50.0) + nccl_all_reduce(3000, 150.0, t=500, corr=2)
    events += [ev("record_param_comms", "cpu_op", 5.0, **{"Collective name": "wait", "In msg nelems": 0})]
    events += [ev("aten::mm", "cpu_op", 99.0), ev("void gemm_kernel", "kernel", 99.0)]
    (stats,) = summarize(events)
    assert (stats.kind, stats.group, stats.group_size, stats.count, stats.source) == (
        "all_reduce",
        "0",
        8,
        2,
        "kernel",
    )
    assert stats.bytes == (1000 + 3000) * 2  # bf16
    assert stats.time_ms == pytest.approx(0.2) and stats.time_source == "device"
    assert stats.wait_ms is None and stats.transfer_ms == pytest.approx(0.2)  # one rank: nothing to wait for
    # nccl-tests: algbw = bytes / time, busbw = algbw * 2(n-1)/n for all-reduce
    assert stats.algbw_gbps == pytest.approx(8000 / 200_000, rel=1e-3)
    assert stats.busbw_gbps == pytest.approx(8000 / 200_000 * 2 * 7 / 8, rel=1e-3)
    assert stats.algorithms == ["RING_LL"] and stats.dtypes == ["BFloat16"]


def test_a_kernel_launched_inside_a_collective_is_communication_whatever_its_name() -> None:
    # GIVEN a symmetric-memory style all-reduce kernel with an unknown name, launched inside c10d::allreduce_
    events = [
        ev("c10d::allreduce_", "cpu_op", 30.0, ts=10),
        ev("cudaLaunchKernel", "cuda_runtime", 5.0, ts=12, correlation=7),
        ev("my_fused_reduce_kernel", "kernel", 40.0, ts=50, correlation=7, stream=7, device=0),
        ev("cudaLaunchKernel", "cuda_runtime", 5.0, ts=100, correlation=8),  # outside: computation
        ev("my_fused_reduce_kernel", "kernel", 40.0, ts=120, correlation=8, stream=7, device=0),
    ]
    table = table_of({0: events})
    data = prepare_rank(table, 0)
    assert data.gpu.kind.tolist() == [COMMUNICATION, 0]
    (stats,) = collective_stats(rank_instances(data))
    assert (stats.kind, stats.count, stats.time_ms) == ("all_reduce", 1, pytest.approx(0.04))


def test_user_comm_patterns() -> None:
    from stepscope.analysis.analyze import analyze

    events = [ev("cudaLaunchKernel", "cuda_runtime", 5.0, ts=12, correlation=7)]
    events += [ev("deepseek_dispatch_v3", "kernel", 40.0, ts=50, correlation=7, stream=7, device=0)]
    table = table_of({0: events})
    assert analyze(table).ranks[0].collectives == []
    (stats,) = analyze(table, comm_patterns=["dispatch"]).ranks[0].collectives
    assert (stats.kind, stats.count, stats.source) == ("other", 1, "kernel")


def test_gloo_ranges_give_count_and_cpu_time() -> None:
    shaped = {"Input Dims": [[1056]], "Input type": ["float"]}
    events = [ev("gloo:all_reduce", "user_annotation", 7.0, ts=10 + 10 * i, **shaped) for i in range(3)]
    events += [ev("c10d::allreduce_", "cpu_op", 1.0, ts=10 + 10 * i) for i in range(3)]
    events += [ev("gloo:broadcast", "user_annotation", 2.0), ev("c10d::broadcast_", "cpu_op", 1.0)]
    stats = {s.kind: s for s in summarize(events)}
    assert stats["all_reduce"].count == 3 and stats["all_reduce"].source == "backend_range"
    assert stats["all_reduce"].time_ms == pytest.approx(0.021) and stats["all_reduce"].time_source == "cpu"
    # the size comes from the recorded shapes (record_shapes=True): 1056 floats each
    assert stats["all_reduce"].bytes == 3 * 1056 * 4 and stats["all_reduce"].dtypes == ["float"]
    # without shapes the size is unknown, not zero
    assert stats["broadcast"].count == 1 and stats["broadcast"].bytes is None
    # a c10d op alone still counts; an NCCL range without kernels only times the enqueue
    only_ops = summarize([ev("c10d::_allgather_base_", "cpu_op", 4.0)])
    assert [(s.kind, s.count, s.source, s.time_ms) for s in only_ops] == [("all_gather", 1, "c10d_op", None)]
    (enqueue,) = summarize([ev("nccl:reduce_scatter_tensor_coalesced", "user_annotation", 3.0)])
    assert (enqueue.kind, enqueue.time_source) == ("reduce_scatter", "cpu enqueue")


def test_concurrent_collectives_are_a_union_in_time() -> None:
    # GIVEN two gradient buckets reduced at once on two gloo threads (DDP), 6 us apart, and a third later
    shaped = {"Input Dims": [[1000]], "Input type": ["float"]}
    events = [
        {**ev("gloo:all_reduce", "user_annotation", 10.0, ts=10, **shaped), "tid": 2},
        {**ev("gloo:all_reduce", "user_annotation", 10.0, ts=16, **shaped), "tid": 3},
        {**ev("gloo:all_reduce", "user_annotation", 4.0, ts=100, **shaped), "tid": 2},
    ]
    (stats,) = summarize(events)
    # THEN their time is the 16 us during which one or both ran, plus the third: never the 24 us of a sum
    assert stats.count == 3 and stats.time_ms == pytest.approx(0.020)
    # AND the bandwidth is their bytes over that time
    assert stats.algbw_gbps == pytest.approx(3 * 4000 / 20_000, rel=1e-3)


def test_only_the_window_counts() -> None:
    from ..support.traces import step

    events = [step(1, 0, 400), *nccl_all_reduce(1000, 50.0), *nccl_all_reduce(1000, 50.0, t=5000, corr=2)]
    (stats,) = rank_collectives(table_of({0: events}), 0)  # launched in step 1: the first collective only
    assert stats.count == 1


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        ("allreduce", "all_reduce"),
        ("allreduce_", "all_reduce"),
        ("all_reduce", "all_reduce"),
        ("AllReduce", "all_reduce"),
        ("_allgather_base_", "all_gather"),
        ("all_gather_into_tensor", "all_gather"),
        ("_reduce_scatter_base", "reduce_scatter"),
        ("reduce_scatter_tensor_coalesced", "reduce_scatter"),
        ("alltoall_base_", "all_to_all"),
        ("all_to_all_single", "all_to_all"),
        ("SendRecv", "send_recv"),
        ("broadcast_", "broadcast"),
        ("barrier", "barrier"),
        ("wait", None),
    ],
)
def test_collective_kinds(raw: str, kind: str | None) -> None:
    assert collective_kind(raw) == kind


def test_nccl_algorithms_and_bus_factors() -> None:
    assert nccl_algorithm("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)") == "RING_LL"
    assert nccl_algorithm("ncclDevKernel_AllGather_RING_LL128") == "RING_LL128"
    assert nccl_algorithm("ncclDevKernel_ReduceScatter_Sum_bf16_NVLS_SIMPLE") == "NVLS_SIMPLE"
    assert nccl_algorithm("ncclDevKernel_SendRecv") is None
    assert bus_factor("all_reduce", 8) == 1.75 and bus_factor("all_gather", 4) == 0.75
    assert bus_factor("broadcast", 8) == 1.0 and bus_factor("barrier", 8) is None


@pytest.mark.shared
def test_real_nccl_trace(shared_traces: Path) -> None:
    table = load_trace(shared_traces / "hta_nccl_parser_config/nccl_data.json.gz")
    (rank,) = table.rank_ids()
    stats = {s.kind: s for s in rank_collectives(table, rank)}
    assert set(stats) == {"all_reduce", "broadcast"} and table.ranks[rank].backend == "nccl"
    # 21 NCCL kernels: 15 all-reduces (5 sizes x 3 steps), 6 broadcasts; each launched in a record_param_comms
    assert stats["all_reduce"].count == 15 and stats["all_reduce"].source == "kernel"
    assert stats["all_reduce"].bytes == 3 * (2049000 + 7875584 + 6563840 + 6637568 + 2431040) * 4
    assert stats["all_reduce"].time_source == "device" and stats["all_reduce"].algorithms == ["RING_LL"]
    assert (stats["all_reduce"].group, stats["all_reduce"].group_size) == ("0", 2)
    assert stats["broadcast"].count == 6 and stats["broadcast"].bytes == 3 * (53120 * 4 + 53 * 8)
    # bus bandwidth = bytes / kernel time (x 2(n-1)/n = 1 for two ranks)
    assert stats["all_reduce"].time_ms is not None and stats["all_reduce"].busbw_gbps == pytest.approx(
        stats["all_reduce"].bytes / (stats["all_reduce"].time_ms * 1e6), rel=1e-3
    )


@pytest.mark.shared
def test_real_gloo_trace(shared_traces: Path) -> None:
    path = shared_traces / "hta_cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
    table = load_trace(path)
    assert table.rank_ids() == [34] and table.ranks[34].backend == "gloo"
    (stats,) = rank_collectives(table, 34)
    # the trace holds one ProfilerStep (#551), during which gloo's two threads started one all-reduce each
    assert (stats.kind, stats.count, stats.time_source) == ("all_reduce", 2, "cpu")
    # the same time computed directly from the file's gloo ranges: the two run at once, so their time is the
    # span from the first start to the last end, not the sum of their durations
    with gzip.open(path, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    (step,) = [e for e in events if e.get("name", "").startswith("ProfilerStep#")]
    first, second = sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("name") == "gloo:all_reduce" and step["ts"] <= e["ts"] < step["ts"] + step["dur"]
    )
    assert second[0] < first[1]  # they overlap
    union_us = max(first[1], second[1]) - first[0]
    assert stats.time_ms == pytest.approx(union_us / 1e3, rel=1e-6)
    assert stats.time_ms < (first[1] - first[0] + second[1] - second[0]) / 1e3
