"""Shared interval helpers: profiler steps per rank, interval unions."""

from __future__ import annotations

import numpy as np

from stepscope.analysis.spans import StepSpan, merge_intervals, profiler_steps, union_ns
from stepscope.analysis.table import TraceTable

from .tracegen import kernel, op, step


def test_profiler_steps_per_rank_sorted_host_side_only() -> None:
    table = TraceTable.from_events(
        {
            0: [
                step(2, 100, 50),
                step(1, 0, 100),
                op("ProfilerStep#3", 150, 10, cat="cpu_op"),
            ],  # 2021: cpu_op
            1: [
                step(7, 5, 20),
                kernel("ProfilerStep#7", 6, 20, cat="gpu_user_annotation"),  # GPU side: not a step
                op("ProfilerStep#x", 0, 1, cat="user_annotation"),  # not a step number
            ],
        }
    )
    assert profiler_steps(table) == [
        StepSpan(0, 1, 0, 100_000),
        StepSpan(0, 2, 100_000, 150_000),
        StepSpan(0, 3, 150_000, 160_000),
        StepSpan(1, 7, 5_000, 25_000),
    ]
    assert [s.step for s in profiler_steps(table, rank=1)] == [7]
    assert profiler_steps(table)[1].dur_ns == 50_000
    assert profiler_steps(TraceTable.from_events({0: [op("a", 0, 1)]})) == []


def test_merge_intervals_and_union() -> None:
    starts = np.array([10, 0, 5, 30, 20, 40])
    ends = np.array([15, 8, 12, 35, 30, 40])
    s, e = merge_intervals(starts, ends)
    assert (s.tolist(), e.tolist()) == ([0, 20, 40], [15, 35, 40])  # touching intervals are joined
    assert union_ns(starts, ends) == 30
    assert union_ns(np.array([], dtype=np.int64), np.array([], dtype=np.int64)) == 0
