"""Collectives from trace events: count, bytes and time per kind, without counting one collective twice."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from stepscope.analysis.collectives import CollectiveStats, collective_kind, rank_collectives
from stepscope.analysis.loader import load_trace

from ._traces import table_of


def ev(name: str, cat: str, dur: float, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "name": name, "cat": cat, "pid": 1, "tid": 1, "ts": 10, "dur": dur, "args": args}


def summarize(events: list[dict[str, Any]]) -> list[CollectiveStats]:
    return rank_collectives(table_of({0: events}), 0, 0, 10**12)


def nccl_all_reduce(nelems: int, kernel_us: float) -> list[dict[str, Any]]:
    """What one NCCL all-reduce leaves in a trace: c10d op, record_param_comms, backend range, kernel."""
    comm_args = {
        "Collective name": "allreduce",
        "In msg nelems": nelems,
        "dtype": "BFloat16",
        "Group size": 8,
    }
    return [
        ev("c10d::allreduce_", "cpu_op", 30.0),
        ev("record_param_comms", "cpu_op", 20.0, **comm_args),
        ev("nccl:all_reduce", "user_annotation", 10.0),
        ev(
            "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
            "kernel",
            kernel_us,
            **comm_args,
        ),
        ev("nccl:all_reduce", "gpu_user_annotation", kernel_us),
    ]


def test_each_collective_counts_once_with_bytes_and_device_time() -> None:
    events = nccl_all_reduce(1000, 50.0) + nccl_all_reduce(3000, 150.0)
    events += [ev("record_param_comms", "cpu_op", 5.0, **{"Collective name": "wait", "In msg nelems": 0})]
    events += [ev("aten::mm", "cpu_op", 99.0), ev("void gemm_kernel", "kernel", 99.0)]
    (stats,) = summarize(events)
    assert stats.kind == "all_reduce" and stats.count == 2 and stats.count_source == "record_param_comms"
    assert stats.bytes == (1000 + 3000) * 2  # bf16
    assert stats.time_ms == pytest.approx(0.2) and stats.time_source == "device"
    assert stats.dtypes == ["BFloat16"] and stats.group_sizes == [8]


def test_gloo_ranges_give_count_and_cpu_time() -> None:
    shaped = {"Input Dims": [[1056]], "Input type": ["float"]}
    events = [ev("gloo:all_reduce", "user_annotation", 7.0, **shaped) for _ in range(3)]
    events += [ev("c10d::allreduce_", "cpu_op", 1.0) for _ in range(3)]
    events += [ev("gloo:broadcast", "user_annotation", 2.0), ev("c10d::broadcast_", "cpu_op", 1.0)]
    stats = {s.kind: s for s in summarize(events)}
    assert stats["all_reduce"].count == 3 and stats["all_reduce"].count_source == "backend_range"
    assert stats["all_reduce"].time_ms == pytest.approx(0.021) and stats["all_reduce"].time_source == "cpu"
    # without record_param_comms the size is unknown, not zero
    assert stats["broadcast"].count == 1 and stats["broadcast"].bytes is None
    # a c10d op alone still counts; an NCCL range without kernels only times the enqueue
    only_ops = summarize([ev("c10d::_allgather_base_", "cpu_op", 4.0)])
    assert [(s.kind, s.count, s.count_source, s.time_ms) for s in only_ops] == [
        ("all_gather", 1, "c10d_op", None)
    ]
    (enqueue,) = summarize([ev("nccl:reduce_scatter_tensor_coalesced", "user_annotation", 3.0)])
    assert (enqueue.kind, enqueue.time_source) == ("reduce_scatter", "cpu enqueue")


def test_only_the_window_counts() -> None:
    events = nccl_all_reduce(1000, 50.0)
    late = [dict(e, ts=5000) for e in nccl_all_reduce(1000, 50.0)]
    table = table_of({0: events + late})
    (stats,) = rank_collectives(table, 0, 0, 1_000_000)  # ns: the first collective only
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


@pytest.mark.shared
def test_real_nccl_trace(shared_traces: Path) -> None:
    table = load_trace(shared_traces / "hta_nccl_parser_config/nccl_data.json.gz")
    (rank,) = table.rank_ids()
    stats = {s.kind: s for s in rank_collectives(table, rank, -(2**62), 2**62)}
    assert set(stats) == {"all_reduce", "broadcast"} and table.ranks[rank].backend == "nccl"
    # 27 record_param_comms: 15 all-reduces (5 sizes x 3 steps), 6 broadcasts, 6 waits (not collectives)
    assert stats["all_reduce"].count == 15
    assert stats["all_reduce"].bytes == 3 * (2049000 + 7875584 + 6563840 + 6637568 + 2431040) * 4
    assert stats["all_reduce"].time_source == "device"
    assert stats["broadcast"].count == 6 and stats["broadcast"].bytes == 3 * (53120 * 4 + 53 * 8)


@pytest.mark.shared
def test_real_gloo_trace(shared_traces: Path) -> None:
    path = shared_traces / "hta_cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
    table = load_trace(path)
    assert table.rank_ids() == [34] and table.ranks[34].backend == "gloo"
    (stats,) = rank_collectives(table, 34, -(2**62), 2**62)
    assert (stats.kind, stats.count, stats.time_source) == ("all_reduce", 10, "cpu")
    # the same time computed directly from the file's gloo ranges
    with gzip.open(path, "rt") as fh:
        ranges = [e for e in json.load(fh)["traceEvents"] if e.get("name") == "gloo:all_reduce"]
    assert stats.time_ms == pytest.approx(sum(e["dur"] for e in ranges) / 1e3, rel=1e-6)
