"""Small interval helpers over a TraceTable shared by the analyzers: profiler steps, interval unions."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from stepscope.analysis.table import GPU_CATEGORIES, TraceTable

_STEP_NAME = re.compile(r"ProfilerStep#(\d+)")
_GPU_SIDE = (*GPU_CATEGORIES, "gpu_user_annotation")


@dataclass(frozen=True)
class StepSpan:
    """One `ProfilerStep#N` range recorded on the host (times in ns)."""

    rank: int
    step: int
    start_ns: int
    end_ns: int

    @property
    def dur_ns(self) -> int:
        return self.end_ns - self.start_ns


def profiler_steps(table: TraceTable, rank: int | None = None) -> list[StepSpan]:
    """The host-side ProfilerStep#N spans (any category but the GPU ones, so 2021 `Operator` ones count),
    sorted by rank and start; only `rank`'s when given."""
    is_step_name = table.names_matching(lambda n: _STEP_NAME.fullmatch(n) is not None)
    if not is_step_name.any():
        return []
    mask = is_step_name[table.name] & (table.ph == ord("X")) & ~table.cat_mask(*_GPU_SIDE)
    if rank is not None:
        mask &= table.rank == rank
    rows = np.flatnonzero(mask)
    order = np.lexsort((table.ts[rows], table.rank[rows]))
    spans = []
    for i in rows[order].tolist():
        match = _STEP_NAME.fullmatch(table.name_of(i))
        assert match is not None
        start = int(table.ts[i])
        spans.append(StepSpan(int(table.rank[i]), int(match.group(1)), start, start + int(table.dur[i])))
    return spans


def merge_intervals(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of [start, end) intervals as sorted, disjoint intervals (touching ones are joined)."""
    if len(starts) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    order = np.argsort(starts, kind="stable")
    s = np.asarray(starts, dtype=np.int64)[order]
    e = np.maximum.accumulate(np.asarray(ends, dtype=np.int64)[order])
    # A new interval begins where a start lies beyond every end seen so far.
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > e[:-1]
    first = np.flatnonzero(new)
    last = np.r_[first[1:] - 1, len(s) - 1]
    return s[first], e[last]


def union_ns(starts: np.ndarray, ends: np.ndarray) -> int:
    """Total length covered by the intervals (overlaps counted once)."""
    s, e = merge_intervals(starts, ends)
    return int((e - s).sum())
