"""Parallelism, measured true (#28): collectives by the kind the job issued, each in its process group, on real
torchrun gloo jobs (tests/support/jobs/parallelism.py) and synthetic GPU traces."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..support.jobs import fsdp2_run, trace_ops
from ..support.output import analyze_json

__all__ = ["fsdp2_run"]  # the fixture, from tests/support


@pytest.mark.slow
def test_fsdp2_collectives_by_issued_kind(fsdp2_run: Path) -> None:
    # GIVEN FSDP2 (fully_shard on 4 Linear layers) on 2 gloo ranks, 2 steps recorded: gloo runs every
    # c10d::_reduce_scatter_base_ as a `gloo:all_reduce` range
    result = analyze_json(fsdp2_run)
    for rank in (0, 1):
        ops = trace_ops(fsdp2_run, rank)
        assert ops["c10d::_reduce_scatter_base_"] > 0 and "c10d::allreduce_" not in ops
        # THEN analyze counts the collectives the job issued: reduce-scatters and all-gathers, no all-reduce
        stats = {c["kind"]: c for c in result["ranks"][rank]["collectives"]}
        assert set(stats) == {"reduce_scatter", "all_gather"}
        assert stats["reduce_scatter"]["count"] == ops["c10d::_reduce_scatter_base_"]
        assert stats["all_gather"]["count"] == ops["c10d::_allgather_base_"]
        assert all(c["time_source"] == "cpu" and c["time_ms"] > 0 for c in stats.values())


def test_gpu_collectives_take_the_issued_kind_and_the_group_of_their_args(tmp_path: Path) -> None:
    from ..support.traces import cpu, launched, step, write_trace

    # GIVEN an NCCL rank: a tensor-parallel functional all-reduce (c10d op and record_param_comms inside,
    # then wait_tensor) on group "3" (mesh_tp), and an all-to-all on group "1" (mesh_ep) that NCCL runs as
    # two SendRecv kernels
    def comm(name: str, ts: float, pg: str, desc: str) -> dict:  # type: ignore[type-arg]
        args = {"Collective name": name, "Process Group Name": pg, "Process Group Description": desc,
                "Process Group Ranks": "[0, 1]", "Group size": 2, "In msg nelems": 256, "dtype": "Float"}  # fmt: skip
        return cpu("record_param_comms", ts, 8, **args)

    events = [
        step(1, 0, 200),
        cpu("_c10d_functional::all_reduce", 10, 20),
        cpu("c10d::allreduce_", 11, 15),
        comm("allreduce", 12, "3", "mesh_tp"),
        *launched("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 13, 40, 10, corr=1),
        cpu("_c10d_functional::wait_tensor", 35, 20),
        cpu("c10d::alltoall_base_", 60, 20),
        comm("all_to_all", 61, "1", "mesh_ep"),
        *launched("ncclDevKernel_SendRecv", 62, 90, 10, corr=2),
        *launched("ncclDevKernel_SendRecv", 64, 90, 12, corr=3, stream=8),
    ]
    path = write_trace(tmp_path / "rank0.json", events)
    # THEN each collective is counted once, as the job issued it, in its group and dimension
    stats = {c["kind"]: c for c in analyze_json(path)["ranks"][0]["collectives"]}
    assert set(stats) == {"all_reduce", "all_to_all"}
    assert stats["all_reduce"]["count"] == stats["all_to_all"]["count"] == 1
    assert (stats["all_reduce"]["group"], stats["all_reduce"]["dim"]) == ("3", "tp")
    assert (stats["all_to_all"]["group"], stats["all_to_all"]["dim"]) == ("1", "ep")
    assert all(s["group_source"] == "trace" and s["group_ranks"] == [0, 1] for s in stats.values())
    assert stats["all_to_all"]["time_ms"] == pytest.approx(0.012)


def test_gloo_ranges_without_a_group_say_unknown_or_take_the_only_group(tmp_path: Path) -> None:
    from ..support.traces import cpu, step, trace, write

    # GIVEN gloo ranks whose ranges name no group: one rank of one group, one rank of three (a mesh)
    events = [step(1, 0, 100), cpu("c10d::_reduce_scatter_base_", 10, 5),
              cpu("gloo:all_reduce", 12, 30, cat="user_annotation", tid=7)]  # fmt: skip
    one = trace(events, 0)
    one["distributedInfo"]["pg_config"] = [{"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1]}]
    three = trace(events, 0)
    three["distributedInfo"]["pg_config"] = [
        {"pg_name": n, "pg_desc": d, "ranks": r}
        for n, d, r in (("0", "default_pg", [0, 1, 2, 3]), ("1", "mesh_dp", [0, 2]), ("3", "mesh_tp", [0, 1]))
    ]
    # THEN the reduce-scatter is one, in the only group, else in no group with group_source unknown
    (only,) = analyze_json(write(tmp_path / "one.json", one))["ranks"][0]["collectives"]
    assert (only["kind"], only["count"], only["group"], only["dim"]) == (
        "reduce_scatter",
        1,
        "0",
        "default_pg",
    )
    assert only["group_source"] == "only group"
    (unknown,) = analyze_json(write(tmp_path / "three.json", three))["ranks"][0]["collectives"]
    assert (unknown["kind"], unknown["group"], unknown["dim"], unknown["group_source"]) == (
        "reduce_scatter", None, None, "unknown"
    )  # fmt: skip
