"""What changed between two runs: step time, GPU busy time, per-op and per-kernel deltas (pure compute).

Each side may be a trace, a folder of traces or a run folder; all its ranks are pooled. Ops are compared by
self time (see summary.py), kernels by total time. Rows are ranked by the absolute change of their total;
a kernel or op whose mean duration changed by `factor` or more (either way) is flagged, the classic case
being the same NCCL kernels hundreds of times slower in one run.
"""

from __future__ import annotations

import msgspec
import numpy as np

from stepscope.analysis import _intervals as iv
from stepscope.analysis.steps import find_steps
from stepscope.analysis.summary import (
    CPU_OP_CATEGORIES,
    KernelStat,
    OpStat,
    kernel_stats,
    op_stats,
    self_times,
)
from stepscope.analysis.table import GPU_CATEGORIES, TraceTable

DIFF_SCHEMA = "stepscope.diff/1"
DEFAULT_FACTOR = 5.0


class Side(msgspec.Struct):
    """Totals of one run (all its ranks together)."""

    path: str
    ranks: list[int]
    steps: int  # ProfilerStep spans, all ranks
    step_mean_us: float | None  # mean duration of those spans
    cpu_self_us: float  # self time of all CPU ops
    kernel_total_us: float  # sum of kernel durations
    gpu_busy_us: float  # union of kernel, memcpy and memset intervals, summed over ranks
    gpu_span_us: float  # first to last GPU activity, summed over ranks
    gpu_busy_pct: float | None


class Delta(msgspec.Struct):
    """One op or kernel name in both runs. Means are None where the name does not occur."""

    name: str
    status: str  # "added" (only in test), "removed" (only in base), "changed"
    base_count: int
    test_count: int
    delta_count: int
    base_total_us: float
    test_total_us: float
    delta_total_us: float
    base_mean_us: float | None
    test_mean_us: float | None
    mean_ratio: float | None  # test mean / base mean
    flagged: bool  # mean_ratio >= factor or <= 1 / factor


class Diff(msgspec.Struct):
    schema: str
    factor: float
    base: Side
    test: Side
    step_delta_us: float | None
    step_ratio: float | None
    kernels: list[Delta]  # every kernel whose count or total changed, by |delta_total_us|
    ops: list[Delta]  # same for CPU ops (self time)
    notices: list[str]


def diff_tables(
    base: TraceTable,
    test: TraceTable,
    *,
    base_path: str = "base",
    test_path: str = "test",
    factor: float = DEFAULT_FACTOR,
) -> Diff:
    """Compare two loaded runs."""
    base_self, test_self = self_times(base), self_times(test)
    b, t = _side(base, base_self, base_path), _side(test, test_self, test_path)
    notices = [f"base: {n}" for n in base.notices] + [f"test: {n}" for n in test.notices]
    if b.steps != t.steps and b.steps and t.steps:
        notices.append(f"the runs have {b.steps} and {t.steps} profiler steps: totals are not per step")
    if len(b.ranks) != len(t.ranks):
        notices.append(f"the runs have {len(b.ranks)} and {len(t.ranks)} ranks: totals pool all ranks")
    step_delta = step_ratio = None
    if b.step_mean_us is not None and t.step_mean_us is not None:
        step_delta = round(t.step_mean_us - b.step_mean_us, 3)
        step_ratio = _ratio(t.step_mean_us, b.step_mean_us)
    return Diff(
        schema=DIFF_SCHEMA,
        factor=factor,
        base=b,
        test=t,
        step_delta_us=step_delta,
        step_ratio=step_ratio,
        kernels=_deltas(_by_name(kernel_stats(base)), _by_name(kernel_stats(test)), factor),
        ops=_deltas(_op_totals(op_stats(base, base_self)), _op_totals(op_stats(test, test_self)), factor),
        notices=notices,
    )


def _side(table: TraceTable, self_ns: np.ndarray, path: str) -> Side:
    gpu = (table.ph == ord("X")) & table.cat_mask(*GPU_CATEGORIES)
    busy = span = 0
    step_durations: list[int] = []
    for rank in table.rank_ids():
        in_rank = table.rank == rank
        spans = find_steps(table.select(in_rank))
        step_durations += (spans.end - spans.start).tolist()
        rows = gpu & in_rank
        if rows.any():
            start, end = table.ts[rows], table.ts[rows] + table.dur[rows]
            busy += iv.length(iv.merge(start, end))
            span += int(end.max() - start.min())
    ops = (table.ph == ord("X")) & table.cat_mask(*CPU_OP_CATEGORIES)
    kernels = (table.ph == ord("X")) & table.cat_mask("kernel")
    return Side(
        path=path,
        ranks=table.rank_ids(),
        steps=len(step_durations),
        step_mean_us=_us(sum(step_durations) / len(step_durations)) if step_durations else None,
        cpu_self_us=_us(int(self_ns[ops].sum())),
        kernel_total_us=_us(int(table.dur[kernels].sum())),
        gpu_busy_us=_us(busy),
        gpu_span_us=_us(span),
        gpu_busy_pct=round(100.0 * busy / span, 2) if span else None,
    )


_Totals = dict[str, tuple[int, float]]  # name -> (count, total us)


def _by_name(stats: list[KernelStat]) -> _Totals:
    return {s.name: (s.count, s.total_us) for s in stats}


def _op_totals(stats: list[OpStat]) -> _Totals:
    return {s.name: (s.count, s.self_us) for s in stats}


def _deltas(base: _Totals, test: _Totals, factor: float) -> list[Delta]:
    out = []
    for name in base.keys() | test.keys():
        bc, bt = base.get(name, (0, 0.0))
        tc, tt = test.get(name, (0, 0.0))
        if (bc, bt) == (tc, tt):
            continue
        bm = round(bt / bc, 3) if bc else None
        tm = round(tt / tc, 3) if tc else None
        ratio = _ratio(tm, bm) if bm is not None and tm is not None else None
        flagged = ratio is not None and (ratio >= factor or ratio <= 1.0 / factor)
        status = "added" if not bc else "removed" if not tc else "changed"
        out.append(Delta(name, status, bc, tc, tc - bc, bt, tt, round(tt - bt, 3), bm, tm, ratio, flagged))
    out.sort(key=lambda d: (-abs(d.delta_total_us), -abs(d.delta_count), d.name))
    return out


def _ratio(new: float, old: float | None) -> float | None:
    return round(new / old, 4) if old else None


def _us(ns: float) -> float:
    return round(ns / 1000.0, 3)
