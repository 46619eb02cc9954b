"""What one rank adds to a run's totals, in raw integers: its steps, GPU busy time, CPU self time, and its
kernels and ops by name (the diff's sides, diff/compare.py).

Integers in ns, so that the totals of ranks analysed in different processes add up to exactly what the pooled
table gives (rounding happens once, on the sums). Names are as `op_stats` groups them (ProfilerStep#N as
ProfilerStep#*).
"""

from __future__ import annotations

import msgspec
import numpy as np

from stepscope.analysis import intervals as iv
from stepscope.analysis.per_rank.steps import find_steps
from stepscope.analysis.per_rank.summary import (
    CPU_OP_CATEGORIES,
    KERNEL_CATEGORY,
    _group_codes,
    _int_sums,
    self_times,
)
from stepscope.analysis.read.table import GPU_CATEGORIES, TraceTable

Counts = dict[str, tuple[int, int]]  # name -> (calls, total ns)


class RankTotals(msgspec.Struct):
    """One rank's totals (no rank inside: the caller keys them)."""

    step_ns: list[int]  # each ProfilerStep span's duration
    gpu_busy_ns: int  # union of its kernel, memcpy and memset intervals
    gpu_span_ns: int  # first to last GPU activity
    cpu_self_ns: int  # self time of all its CPU ops
    kernel_ns: int  # sum of its kernel durations
    kernels: Counts  # kernel name -> (launches, total duration)
    ops: Counts  # op name -> (calls, self time)


def rank_totals(table: TraceTable) -> dict[int, RankTotals]:
    """Every rank's totals, by rank."""
    ph, name, dur, ts = (table.columns[k] for k in ("ph", "name", "dur", "ts"))
    complete = ph == ord("X")
    gpu = complete & table.cat_mask(*GPU_CATEGORIES)
    ops = complete & table.cat_mask(*CPU_OP_CATEGORIES)
    kernels = complete & table.cat_mask(KERNEL_CATEGORY)
    self_ns = self_times(table)
    codes, group_names = _group_codes(table)
    ranks = table.rank_ids()
    single = len(ranks) == 1
    out = {}
    for rank in ranks:
        in_rank = np.ones(len(table), dtype=bool) if single else table.columns["rank"] == rank
        spans = find_steps(table if single else table.select(in_rank))
        rows = gpu & in_rank
        busy = span = 0
        if rows.any():
            start, end = ts[rows], ts[rows] + dur[rows]
            busy, span = iv.length(iv.merge(start, end)), int(end.max() - start.min())
        k_rows, o_rows = kernels & in_rank, ops & in_rank
        out[rank] = RankTotals(
            step_ns=(spans.end - spans.start).tolist(),
            gpu_busy_ns=int(busy),
            gpu_span_ns=span,
            cpu_self_ns=int(self_ns.sum(where=o_rows)),
            kernel_ns=int(dur.sum(where=k_rows)),
            kernels=_counts(name[k_rows], dur[k_rows], table.names),
            ops=_counts(codes[name[o_rows]], self_ns[o_rows], group_names),
        )
    return out


def _counts(keys: np.ndarray, values: np.ndarray, names: list[str]) -> Counts:
    """(calls, sum of values) per key, named."""
    if not len(keys) or not names:
        return {}
    keys = np.where(keys < 0, len(names) - 1, keys)  # (a missing name reads as the last, as in kernel_stats)
    width = int(keys.max()) + 1
    calls = np.bincount(keys, minlength=width)
    sums = _int_sums(keys, values.astype(np.int64, copy=False), width)
    return {names[int(k)]: (int(calls[k]), int(sums[k])) for k in np.flatnonzero(calls)}


def add_counts(into: Counts, more: Counts) -> None:
    """Add `more` to `into`, name by name."""
    for key, (calls, total) in more.items():
        had_calls, had_total = into.get(key, (0, 0))
        into[key] = (had_calls + calls, had_total + total)
