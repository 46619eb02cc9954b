"""`stepscope diff`: totals, deltas ranked by change, flagged slowdowns, appeared/disappeared names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stepscope.analysis.diff import DIFF_SCHEMA, diff_tables
from stepscope.analysis.loader import load_trace
from stepscope.cli import main

from ._traces import SHARED_TRACES, cpu, kernel, step, trace, write

NCCL = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
BASE = [
    step(1, 0, 1000),
    step(2, 1000, 1000),
    cpu("aten::mm", 100, 200),
    kernel(NCCL, 10, 10, stream=20),
    kernel(NCCL, 30, 10, stream=20),
    kernel("gemm", 100, 100),
    kernel("gemm", 300, 100),
    kernel("gemm", 500, 100),
    kernel("old_kernel", 700, 50),
]
TEST = [
    step(1, 0, 1500),
    step(2, 1500, 1500),
    cpu("aten::mm", 100, 200),
    cpu("aten::foo", 400, 100),
    kernel(NCCL, 10, 5000, stream=20),  # the same NCCL kernel, 500x slower
    kernel(NCCL, 6000, 5000, stream=20),
    kernel("gemm", 100, 110),
    kernel("gemm", 300, 110),
    kernel("gemm", 500, 110),
    kernel("new_kernel", 12000, 20),
    kernel("new_kernel", 12100, 20),
]


@pytest.fixture
def runs(tmp_path: Path) -> tuple[Path, Path]:
    return write(tmp_path / "base.json.gz", trace(BASE)), write(tmp_path / "test.json", trace(TEST))


def test_totals_of_both_sides(runs: tuple[Path, Path]) -> None:
    d = diff_tables(load_trace(runs[0]), load_trace(runs[1]))
    b, t = d.base, d.test
    assert (b.steps, b.step_mean_us, t.steps, t.step_mean_us) == (2, 1000.0, 2, 1500.0)
    assert (d.step_delta_us, d.step_ratio) == (500.0, 1.5)
    assert (b.gpu_busy_us, b.gpu_span_us, b.gpu_busy_pct, b.kernel_total_us) == (370.0, 740.0, 50.0, 370.0)
    assert (t.gpu_busy_us, t.gpu_span_us, t.gpu_busy_pct, t.kernel_total_us) == (
        10040.0,
        12110.0,
        82.91,
        10370.0,
    )
    assert (b.cpu_self_us, t.cpu_self_us) == (2000.0, 3000.0)
    assert d.notices == [] and d.schema == DIFF_SCHEMA


def test_kernel_deltas_ranked_and_flagged(runs: tuple[Path, Path]) -> None:
    d = diff_tables(load_trace(runs[0]), load_trace(runs[1]))
    rows = [
        (
            k.name,
            k.status,
            k.base_count,
            k.test_count,
            k.delta_count,
            k.base_total_us,
            k.test_total_us,
            k.delta_total_us,
            k.base_mean_us,
            k.test_mean_us,
            k.mean_ratio,
            k.flagged,
        )
        for k in d.kernels
    ]
    assert rows == [
        (NCCL, "changed", 2, 2, 0, 20.0, 10000.0, 9980.0, 10.0, 5000.0, 500.0, True),
        ("old_kernel", "removed", 1, 0, -1, 50.0, 0.0, -50.0, 50.0, None, None, False),
        ("new_kernel", "added", 0, 2, 2, 0.0, 40.0, 40.0, None, 20.0, None, False),
        ("gemm", "changed", 3, 3, 0, 300.0, 330.0, 30.0, 100.0, 110.0, 1.1, False),
    ]


def test_op_deltas_use_self_time_and_skip_unchanged(runs: tuple[Path, Path]) -> None:
    d = diff_tables(load_trace(runs[0]), load_trace(runs[1]))
    assert [(o.name, o.status, o.base_total_us, o.test_total_us, o.mean_ratio) for o in d.ops] == [
        ("ProfilerStep#*", "changed", 1800.0, 2700.0, 1.5),
        ("aten::foo", "added", 0.0, 100.0, None),
    ]


def test_factor_changes_what_is_flagged(runs: tuple[Path, Path]) -> None:
    d = diff_tables(load_trace(runs[0]), load_trace(runs[1]), factor=1.05)
    assert [k.name for k in d.kernels if k.flagged] == [NCCL, "gemm"]
    assert [o.name for o in d.ops if o.flagged] == ["ProfilerStep#*"]


def test_different_step_counts_are_noted(tmp_path: Path) -> None:
    base = write(tmp_path / "b.json", trace([step(1, 0, 10)]))
    test = write(tmp_path / "t.json", trace([step(1, 0, 10), step(2, 10, 10)]))
    d = diff_tables(load_trace(base), load_trace(test))
    assert d.notices == ["the runs have 1 and 2 profiler steps: totals are not per step"]


def test_cli_text_report(runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(runs[0]), str(runs[1])]) == 0
    out = capsys.readouterr().out
    assert "Mean duration changed 5x or more:" in out
    assert f"{NCCL}: 10.0 us -> 5.00 ms (500x, 2 calls)" in out.replace("\n", "")
    assert "only in base (1x): old_kernel" in out and "only in test (2x): new_kernel" in out
    assert "only in test (1x): aten::foo" in out
    assert "mean step time" in out and "1.50x" in out


def test_cli_json(runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(runs[0]), str(runs[1]), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "stepscope.diff/1" and doc["factor"] == 5.0
    assert doc["base"]["path"] == str(runs[0]) and doc["test"]["steps"] == 2
    assert doc["kernels"][0]["name"] == NCCL and doc["kernels"][0]["flagged"] is True
    assert set(doc["kernels"][0]) == {
        "name",
        "status",
        "base_count",
        "test_count",
        "delta_count",
        "base_total_us",
        "test_total_us",
        "delta_total_us",
        "base_mean_us",
        "test_mean_us",
        "mean_ratio",
        "flagged",
    }


def test_cli_rejects_factor_of_one(runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(runs[0]), str(runs[1]), "--factor", "1"]) == 2
    assert "--factor" in capsys.readouterr().err


def test_cli_missing_test_run(runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    missing = runs[0].parent / "nope"
    assert main(["diff", str(runs[0]), str(missing)]) == 2
    assert capsys.readouterr().err == f"stepscope: error: {missing}: no such file or directory\n"


@pytest.mark.shared
def test_hta_trace_compare_names_the_kernel_that_disappeared(capsys: pytest.CaptureFixture[str]) -> None:
    base, test = SHARED_TRACES / "hta_trace_compare" / "base", SHARED_TRACES / "hta_trace_compare" / "test"
    if not base.is_dir():
        pytest.skip("../shared/traces not available")
    gone = (
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<int>, "
        "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<int>, at::detail::Array<char*, 3>)"
    )
    d = diff_tables(load_trace(base), load_trace(test))
    assert [(k.name, k.base_count, k.test_count, k.delta_total_us) for k in d.kernels] == [(gone, 3, 2, -4.0)]
    assert {o.name for o in d.ops if o.status == "added"} == {
        "All2All_Pooled_Req",
        "AddmmBackward0",
        "CatBackward0",
    }
    assert main(["diff", str(base), str(test)]) == 0
    out = capsys.readouterr().out.replace("\n", "")
    assert "Kernels launched a different number of times" in out and f"3 -> 2 (-1): {gone}" in out
