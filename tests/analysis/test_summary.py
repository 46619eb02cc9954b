"""`stepscope summary`: self time, kernel totals, per rank; the CLI's tables and JSON."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from stepscope.analysis.per_rank import summary
from stepscope.analysis.per_rank.summary import (
    CPU_OP_CATEGORIES,
    SUMMARY_SCHEMA,
    keep_op_trees,
    op_tree,
    self_times,
    summarize,
    thread_order,
)
from stepscope.analysis.per_rank.summary import _sub_tree as sub_tree
from stepscope.analysis.read.loader import load_trace
from stepscope.cli import main
from stepscope.units import short_name as kernel_label

from ..support.synthetic import nesting_only as _nesting_only
from ..support.synthetic import self_times_by_stack as _self_times_by_stack
from ..support.traces import SHARED_TRACES, cpu, kernel, step, table_of, trace, write

RANK0 = [
    step(1, 0, 1000),
    cpu("nn.Module: Linear", 90, 420, cat="python_function"),  # with_stack frames: not an op, not a parent
    cpu("aten::linear", 100, 400),
    cpu("aten::addmm", 150, 300),
    cpu("cudaLaunchKernel", 200, 50, cat="cuda_runtime"),
    cpu("aten::relu", 600, 100),
    cpu("aten::relu", 750, 50),
    step(2, 1000, 500),
    cpu("aten::linear", 1100, 200),
    cpu("aten::mul", 1400, 200),  # sticks out of ProfilerStep#2 by 100
    cpu("aten::add", 120, 1000, tid=202),  # another thread: nobody's child
    kernel("gemm", 210, 10),
    kernel("gemm", 400, 30, stream=20),
    kernel("relu_kernel", 610, 60),
    kernel("Memcpy HtoD (Pinned -> Device)", 5, 5, cat="gpu_memcpy"),
    kernel("Memset (Device)", 900, 7, cat="gpu_memset"),
]
RANK1 = [cpu("aten::mm", 0, 10), kernel("gemm", 2, 4)]

# name -> (count, self us, total us, self %)
EXPECTED_OPS = {
    "aten::add": (1, 1000.0, 1000.0, 38.46),
    "ProfilerStep#*": (2, 650.0, 1500.0, 25.0),
    "aten::linear": (2, 300.0, 600.0, 11.54),
    "aten::addmm": (1, 250.0, 300.0, 9.62),
    "aten::mul": (1, 200.0, 200.0, 7.69),
    "aten::relu": (2, 150.0, 150.0, 5.77),
    "cudaLaunchKernel": (1, 50.0, 50.0, 1.92),
}


@pytest.fixture
def traces(tmp_path: Path) -> Path:
    write(tmp_path / "rank0.json.gz", trace(RANK0, rank=0))
    write(tmp_path / "rank1.json", trace(RANK1, rank=1))
    return tmp_path


def test_self_time_subtracts_direct_children_on_the_same_thread(traces: Path) -> None:
    summary = summarize(load_trace(traces), top=0)
    r0 = summary.ranks[0]
    assert [o.name for o in r0.ops] == list(EXPECTED_OPS)
    for o in r0.ops:
        assert (o.count, o.self_us, o.total_us, o.self_pct) == EXPECTED_OPS[o.name], o.name
        assert o.mean_self_us == round(o.self_us / o.count, 3)
    assert r0.cpu_self_us == 2600.0


def test_kernels_by_total_time_per_rank(traces: Path) -> None:
    summary = summarize(load_trace(traces), top=0)
    r0, r1 = summary.ranks
    assert [(k.name, k.count, k.total_us, k.mean_us, k.pct) for k in r0.kernels] == [
        ("relu_kernel", 1, 60.0, 60.0, 60.0),
        ("gemm", 2, 40.0, 20.0, 40.0),
    ]
    assert (r0.kernel_us, r0.memcpy_us, r0.memset_us) == (100.0, 5.0, 7.0)
    assert (r1.rank, [(k.name, k.total_us, k.pct) for k in r1.kernels]) == (1, [("gemm", 4.0, 100.0)])
    assert [(o.name, o.self_us) for o in r1.ops] == [("aten::mm", 10.0)]


def test_top_limits_rows(traces: Path) -> None:
    summary = summarize(load_trace(traces), top=2)
    assert [o.name for o in summary.ranks[0].ops] == ["aten::add", "ProfilerStep#*"]
    assert len(summary.ranks[0].kernels) == 2 and summary.top == 2


def test_self_time_edge_cases() -> None:
    # identical intervals nest (the first is the parent); zero-length events take nothing; ns exact
    events = [
        cpu("outer", 0, 10),
        cpu("same", 0, 10),
        cpu("zero", 5, 0),
        cpu("inner", 2.5, 0.001),
        cpu("later", 20, 1, cat="user_annotation"),
        kernel("k", 0, 5),
    ]
    table = table_of({0: events})
    assert self_times(table).tolist() == [0, 9999, 0, 1, 1000, 0]


@pytest.mark.parametrize("seed", range(40))
def test_self_times_match_the_stack_definition_on_random_ops(seed: int) -> None:
    # ops that nest, ops that nest but for a few, ops at random; zero-length and identical ones; several threads
    rng = np.random.default_rng(seed)
    events = []
    for tid in range(int(rng.integers(1, 4))):
        for _ in range(int(rng.integers(1, 120))):
            start = int(rng.integers(0, 400)) / 4
            length = 0.0 if rng.random() < 0.1 else int(rng.integers(1, 200)) / 4
            events.append(cpu("op", start, length, tid=tid))
    if seed % 3 != 2:
        events = _nesting_only(events)
    if seed % 3 == 1:  # then a few ops made longer: overlaps in a thread that otherwise nests
        for i in rng.integers(0, len(events), 3).tolist():
            events[i] = {**events[i], "dur": events[i]["dur"] + int(rng.integers(1, 40)) / 4}
    table = table_of({0: events})
    assert self_times(table).tolist() == _self_times_by_stack(events)


def test_empty_trace_summary(tmp_path: Path) -> None:
    summary = summarize(load_trace(write(tmp_path / "t.json", trace([]))))
    assert [(r.rank, r.ops, r.kernels, r.cpu_self_us) for r in summary.ranks] == [(0, [], [], 0.0)]


def test_cli_json_document(traces: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", str(traces), "--json", "--top", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == SUMMARY_SCHEMA == "stepscope.summary/1"
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    assert doc["ranks"][0]["ops"] == [
        {
            "name": "aten::add",
            "count": 1,
            "self_us": 1000.0,
            "total_us": 1000.0,
            "mean_self_us": 1000.0,
            "self_pct": 38.46,
        }
    ]
    assert doc["ranks"][0]["kernels"] == [
        {"name": "relu_kernel", "count": 1, "total_us": 60.0, "mean_us": 60.0, "pct": 60.0}
    ]
    assert doc["ranks"][0]["source"].endswith("rank0.json.gz") and doc["notices"] == []


def test_cli_tables(traces: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", str(traces / "rank0.json.gz"), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "Top 3 CPU ops by self time" in out and "Top 2 GPU kernels by total time" in out
    assert "aten::add" in out and "ProfilerStep#*" in out and "aten::relu" not in out
    assert "relu_kernel" in out and "60.0%" in out and "38.5%" in out


def test_cli_prints_notices_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path / "a.json", trace([cpu("a", 0, 1)], rank=None))
    write(tmp_path / "b.json", trace([cpu("b", 0, 1)], rank=None))
    assert main(["summary", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "b.json: no distributedInfo.rank; loaded as rank 1" in err


def test_kernel_label_keeps_the_informative_start() -> None:
    name = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int, float*)"
    assert kernel_label(name, 200) == name
    assert (
        kernel_label(name, 80)
        == "at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>"
    )
    label = kernel_label(name, 30)
    assert len(label) == 30 and label.startswith("at::native::vector") and label.endswith("<float>>")


@pytest.mark.shared
def test_shared_trace_self_times_are_consistent() -> None:
    path = SHARED_TRACES / "hta_ns_resolution_trace"
    table = load_trace(path)
    selfs = self_times(table)
    ops = table.cat_mask("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver") & (
        table.columns["ph"] == ord("X")
    )
    assert (
        (selfs[ops] >= 0).all()
        and (selfs[ops] <= table.columns["dur"][ops]).all()
        and (selfs[~ops] == 0).all()
    )
    summary = summarize(table, top=5)
    (r0,) = summary.ranks
    kernels = table.cat_mask("kernel")
    assert r0.kernel_us == round(int(table.columns["dur"][kernels].sum()) / 1000, 3)
    assert sum(k.count for k in summary.ranks[0].kernels) <= int(kernels.sum())
    assert np.isclose(sum(k.pct for k in summarize(table, top=0).ranks[0].kernels), 100.0, atol=0.1)


@pytest.mark.parametrize("seed", range(30))
def test_cpu_op_nesting_taken_from_all_host_ops_is_what_cpu_ops_alone_give(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the cpu_op tree is derived from the tree of all host ops when that one nests (keep_op_trees); the
    # parents and self times must be those of a tree built from the cpu_ops alone, nesting or not
    rng = np.random.default_rng(1000 + seed)
    events = []
    for tid in range(int(rng.integers(1, 3))):
        for _ in range(int(rng.integers(1, 80))):
            start = int(rng.integers(0, 300)) / 4
            length = 0.0 if rng.random() < 0.1 else int(rng.integers(1, 120)) / 4
            cat = str(rng.choice(["cpu_op", "cpu_op", "user_annotation", "cuda_runtime"]))
            events.append(cpu("op", start, length, cat=cat, tid=tid))
    if seed % 2 == 0:  # (odd seeds keep their overlaps: no tree is derived then)
        events = _nesting_only(events)
    alone = table_of({0: events})
    direct = op_tree(alone, ("cpu_op",))
    derived_from = table_of({0: events})
    everything = op_tree(derived_from, CPU_OP_CATEGORIES)
    made = []
    monkeypatch.setattr(summary, "_sub_tree", lambda *a: made.append(1) or sub_tree(*a))
    keep_op_trees(derived_from, ("cpu_op",))
    derived = op_tree(derived_from, ("cpu_op",))
    assert len(made) == everything.nested
    assert derived.rows.tolist() == direct.rows.tolist()
    assert derived.parent.tolist() == direct.parent.tolist()
    assert self_times(derived_from, ("cpu_op",)).tolist() == self_times(alone, ("cpu_op",)).tolist()
    if seed % 2 == 0:
        assert made  # the derivation was exercised


@pytest.mark.parametrize("seed", range(12))
def test_thread_order_is_the_lexsort_order(seed: int) -> None:
    # by thread keys, then start, longest first; ties kept as given; constant and varying keys, negative ids
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    start = rng.integers(0, 50 if seed % 2 else 5000, n)
    start[: n // 2] = np.sort(start[: n // 2])  # partly in order, as traces are
    end = start + rng.integers(0, 20, n)
    keys = [
        np.full(n, 3, dtype=np.int32),
        rng.choice(np.array([7, -549452224], dtype=np.int64), n),
        rng.choice(np.array([2910249, 5, -1], dtype=np.int64), n) if seed % 3 else np.full(n, 5),
    ]
    expected = np.lexsort((-end, start, *reversed(keys)))
    assert thread_order(keys, start, end).tolist() == expected.tolist()
