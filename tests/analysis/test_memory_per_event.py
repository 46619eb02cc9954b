"""Memory per event of the analyses on traces of tiny events (#34 item 14): `summary`, `analyze` and `diff` need
less than the loaded table again, and what they compute in pieces is what the whole-array definitions give."""

from __future__ import annotations

import itertools
import subprocess
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stepscope.analysis import intervals as iv
from stepscope.analysis.analyze import analyze
from stepscope.analysis.diff.compare import diff_paths
from stepscope.analysis.per_rank import _nesting, summary
from stepscope.analysis.per_rank.summary import op_tree, self_times, summarize
from stepscope.analysis.read.loader import load_trace

from ..support.synthetic import nesting_only as _nesting_only
from ..support.synthetic import self_times_by_stack as _self_times_by_stack
from ..support.traces import cpu, table_of

ROOT = Path(__file__).resolve().parents[2]


def _tiny_file(folder: Path, name: str, *options: str) -> Path:
    out = folder / name
    maker = ROOT / "benchmarks" / "make_big_trace.py"
    argv = [sys.executable, str(maker), "--size", "40M", "--tiny", *options, "--out", str(out)]
    subprocess.run(argv, check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def tiny_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 MB of tiny CPU ops (480,048 events; a ProfilerStep every 10,000)."""
    return _tiny_file(tmp_path_factory.mktemp("tiny"), "tiny40m.json")


@pytest.fixture(scope="module")
def one_step_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 MB of tiny CPU ops (480,001 events) under one ProfilerStep: one nesting group of them all."""
    return _tiny_file(tmp_path_factory.mktemp("tiny"), "one_step40m.json", "--one-step")


def _peak_bytes(work: Callable[[], Any]) -> int:
    """The most memory `work` holds at once beyond what was held before it (numpy arrays included)."""
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _table_bytes(path: Path) -> tuple[Any, int]:
    table = load_trace(path, workers=1, flows=False)
    return table, sum(column.nbytes for column in table.columns.values())


# The limits, as a share of the loaded table's columns at full width (61 B an event, as `nbytes` counts them):
# what each analysis may hold at once on top of the table. Measured 0.69 (summary) and 0.73 (analyze); analyze
# held 0.92 while the untraced time kept the op rows and made its gaps beside the busy time; the per-op nesting,
# self times and unions of every op held whole took 1.49 and 1.97.
@pytest.mark.parametrize(("name", "limit"), [("summary", 0.85), ("analyze", 0.9)])
def test_an_analysis_of_tiny_events_holds_less_than_the_table_again(
    tiny_trace: Path, name: str, limit: float
) -> None:
    table, table_bytes = _table_bytes(tiny_trace)
    assert len(table) == 480_048
    run = {"summary": lambda: summarize(table), "analyze": lambda: analyze(table)}[name]
    peak = _peak_bytes(run)
    assert peak <= limit * table_bytes, (
        f"{name}: {peak / 1e6:.1f} MB on a table of {table_bytes / 1e6:.1f} MB"
    )


def test_a_table_of_tiny_cpu_events_holds_only_the_columns_that_vary(tiny_trace: Path) -> None:
    # name, cat, ts and dur vary (24 B an event); rank, ph, pid, tid, stream, device and correlation hold one
    # value each and are kept as that value. Measured: 24.0 B an event held, 37.8 at the load's peak (the
    # columns growing by an eighth, a chunk's decoded events); every column at full width held 61
    result: list[Any] = []
    tracemalloc.start()
    try:
        result.append(load_trace(tiny_trace, workers=1, flows=False))
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    (table,) = result
    n = len(table)
    assert held <= 26 * n and peak <= 42 * n, f"{held / n:.1f} B an event held, {peak / n:.1f} at the peak"


@pytest.mark.slow
@pytest.mark.parametrize("steps", [48, 1])
def test_diff_holds_one_run_at_a_time(tiny_trace: Path, one_step_trace: Path, steps: int) -> None:
    # the load included: one table, its analysis, the other run's small results; never both tables
    # (measured alone 0.81 tables of 61 B an event, 0.93 with every op under one step, and up to 1.3 after the
    # other analysis tests in one process; columns of one value kept at
    # full width took 1.9, both tables and both analyses held at once 4.4, one step's nesting solved whole
    # 1.43)
    trace = tiny_trace if steps > 1 else one_step_trace
    _, table_bytes = _table_bytes(trace)
    result: list[Any] = []
    peak = _peak_bytes(lambda: result.append(diff_paths(trace, trace)))
    assert peak <= 1.4 * table_bytes, f"diff: {peak / 1e6:.1f} MB on tables of {table_bytes / 1e6:.1f} MB"
    (d,) = result
    assert d.base.steps == d.test.steps == steps and d.base.cpu_self_us == d.test.cpu_self_us > 0
    assert not [o for o in d.ops if o.flagged]


def _random_ops(seed: int) -> list[dict]:
    """Ops of 1-3 threads in runs separated by gaps (many groups), nesting or not, some of zero length."""
    rng = np.random.default_rng(seed)
    events = []
    for tid in range(int(rng.integers(1, 4))):
        t = 0.0
        for _ in range(int(rng.integers(1, 150))):
            t += int(rng.integers(0, 30)) / 4
            length = 0.0 if rng.random() < 0.1 else int(rng.integers(1, 60 if seed % 2 else 8)) / 4
            cat = str(rng.choice(["cpu_op", "cpu_op", "user_annotation", "cuda_runtime"]))
            start = t if seed % 5 else int(rng.integers(0, 400)) / 4
            events.append(cpu("op", start, length, cat=cat, tid=tid))
    return _nesting_only(events) if seed % 3 == 0 else events


@pytest.mark.parametrize("seed", range(40))
def test_nesting_and_self_times_in_small_pieces_are_the_stack_definition(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pieces of a few events and batches of a few rows: every cut between groups and every batch edge is met
    monkeypatch.setattr(_nesting, "PIECE", 5)
    monkeypatch.setattr(summary, "_BATCH", 7)
    events = _random_ops(seed)
    table = table_of({0: events})
    assert self_times(table).tolist() == _self_times_by_stack(events)
    tree = op_tree(table, ("cpu_op",))
    new_thread = tree.new_thread(table.columns)
    start = table.columns["ts"][tree.rows]
    end = start + table.columns["dur"][tree.rows]
    threads = [*np.flatnonzero(new_thread).tolist(), len(start)]
    expected = np.full(len(start), -1)
    for a, b in itertools.pairwise(threads):
        found = _nesting.parents_loop(start[a:b], end[a:b])
        expected[a:b] = np.where(found >= 0, found + a, -1)
    assert tree.parent.tolist() == expected.tolist()


@pytest.mark.parametrize("deepest", [2, 4096])
@pytest.mark.parametrize("seed", range(30))
def test_one_long_group_solved_a_stretch_at_a_time_is_the_stack_definition(
    seed: int, deepest: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every thread's ops under one op that spans them all (a step annotation around a whole trace): one group
    # per thread, far longer than a piece, solved a stretch at a time after the ops still open where each
    # stretch begins (or whole, past `deepest` of them)
    events = _random_ops(seed)
    for tid in {e["tid"] for e in events}:
        events.insert(0, cpu("step", -1.0, 10_000.0, tid=tid))
    whole = op_tree(table_of({0: events}), ("cpu_op",))
    monkeypatch.setattr(_nesting, "PIECE", 5)
    monkeypatch.setattr(_nesting, "_DEEPEST", deepest)
    monkeypatch.setattr(summary, "_BATCH", 7)
    table = table_of({0: events})
    assert self_times(table).tolist() == _self_times_by_stack(events)
    tree = op_tree(table, ("cpu_op",))
    assert tree.parent.tolist() == whole.parent.tolist() and tree.nested == whole.nested
    assert tree.nested or seed % 3  # (what nests is found to nest)


def _disjoint_set(rng: np.random.Generator, n: int, touching: bool) -> iv.Intervals:
    """Disjoint sorted intervals; `touching`: some cut in two touching parts."""
    start = np.sort(rng.integers(0, 300, n))
    s, e = iv.merge(start, start + rng.integers(0, 15, n) * (rng.random(n) > 0.1))
    if touching and len(s):
        cut = (e - s > 2) & (rng.random(len(s)) < 0.5)
        middle = (s[cut] + e[cut]) // 2
        s, e = np.sort(np.r_[s, middle]), np.sort(np.r_[e, middle])
    return s, e


@pytest.mark.parametrize("seed", range(200))
def test_subtract_and_complement_are_the_sweep(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(seed)
    a = _disjoint_set(rng, int(rng.integers(1, 50)), seed % 2 == 1)
    b = _disjoint_set(rng, int(rng.integers(0, 20)), seed % 3 == 0)
    swept = iv._sweep([a, b], lambda mask: mask == 1)
    got = iv.subtract(a, b)
    assert (got[0].tolist(), got[1].tolist()) == (swept[0].tolist(), swept[1].tolist())
    lo, hi = sorted(int(x) for x in rng.integers(-10, 320, 2))
    window = (np.array([lo]), np.array([hi]))
    swept = iv._sweep([window, b], lambda mask: mask == 1)
    got = iv.complement(b, lo, hi)
    assert (got[0].tolist(), got[1].tolist()) == (swept[0].tolist(), swept[1].tolist())
    # given up to complement (it shifts them in place, in blocks of 3 here): the same intervals
    monkeypatch.setattr(iv, "_SHIFT_BLOCK", 3)
    got = iv.complement((b[0].copy(), b[1].copy()), lo, hi, owned=True)
    assert (got[0].tolist(), got[1].tolist()) == (swept[0].tolist(), swept[1].tolist())
