"""Tensor parallel (#28 item 7): functional collectives by layer, on the real 4-rank (dp, tp) mesh job of
tests/support/jobs/parallelism.py (no module ranges: the position) and on a synthetic trace with nn.Module ranges."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..support.jobs import run_parallel_job as run_job
from ..support.jobs import trace_ops
from ..support.output import analyze_json
from ..support.traces import cpu, step, write_trace


@pytest.mark.slow
def test_mesh_functional_all_reduce_attributed_to_its_forward_position(tmp_path: Path) -> None:
    # GIVEN the (2, 2) dp x tp mesh on 4 gloo ranks: a colwise + rowwise Linear pair, whose rowwise output is
    # all-reduced over tp by a functional all_reduce in forward (no nn.Module ranges in the trace)
    run_dir = run_job("mesh", 4, tmp_path)
    result = analyze_json(run_dir)
    for rank in range(4):
        ops = trace_ops(run_dir, rank)
        # THEN each rank lists that all-reduce once per step, as the first of its forward, with its time and size
        (layer,) = result["tensor"]["ranks"][rank]["layers"]
        assert layer["op"] == "_c10d_functional::all_reduce" and layer["kind"] == "all_reduce"
        assert layer["count"] == ops["_c10d_functional::all_reduce"] == 2 and layer["per_step"] == 1.0
        assert (layer["layer"], layer["layer_source"]) == ("forward #1", "position")
        assert layer["time_source"] == "cpu" and layer["time_ms"] > 0
        assert layer["bytes"] == 2 * 4 * 16 * 4  # two steps of the (4, 16) float output of the rowwise Linear


def test_functional_collectives_take_their_module(tmp_path: Path) -> None:
    # GIVEN a trace with module ranges (with_modules): an all_reduce in Linear_1, an all_gather in Linear_0,
    # and one outside any module after the backward began
    events = [
        step(1, 0, 1000),
        cpu("nn.Module: Sequential_0", 5, 400, cat="python_function"),
        cpu("nn.Module: Linear_0", 10, 100, cat="python_function"),
        cpu("_c10d_functional::all_gather_into_tensor", 20, 10),
        cpu("nn.Module: Linear_1", 200, 100, cat="python_function"),
        cpu("_c10d_functional::all_reduce", 220, 10),
        cpu("_c10d_functional::wait_tensor", 240, 5),
        cpu("autograd::engine::evaluate_function: MmBackward0", 500, 100),
        cpu("_c10d_functional::reduce_scatter_tensor", 520, 10),
    ]
    result = analyze_json(write_trace(tmp_path / "r.json", events))
    layers = [
        (x["layer"], x["layer_source"], x["kind"], x["count"]) for x in result["tensor"]["ranks"][0]["layers"]
    ]
    # THEN each in its innermost module, the one outside any in its phase; wait_tensor is no collective
    assert layers == [
        ("Linear_0", "module", "all_gather", 1),
        ("Linear_1", "module", "all_reduce", 1),
        ("backward #1", "position", "reduce_scatter", 1),
    ]
