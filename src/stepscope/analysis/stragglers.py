"""Cross-rank view: per-rank step time and communication wait, and the slowest rank.

In a collective every rank waits inside the communication kernel for the last one to arrive, so the rank with the
*least* communication time per step is usually the one the others are waiting for.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from stepscope.analysis.steps import StepRow, pct


class RankStepStat(msgspec.Struct):
    rank: int
    steps: int
    step_us: float | None  # mean step time over the window
    comm_wait_us: float | None  # mean communication-kernel time per step (null: no communication)


class Stragglers(msgspec.Struct):
    """Step time and communication wait of every rank; the slowest rank and by how much."""

    ranks: list[RankStepStat]
    slowest_rank: int | None
    fastest_rank: int | None
    slowest_step_us: float | None
    fastest_step_us: float | None
    spread_us: float | None  # slowest - fastest mean step time
    spread_pct: float | None  # of the fastest
    least_comm_wait_rank: int | None  # likely the rank the others wait for


def cross_rank(steps_by_rank: dict[int, Sequence[StepRow]]) -> Stragglers | None:
    """Compare ranks; None with fewer than two ranks."""
    if len(steps_by_rank) < 2:
        return None
    stats = []
    for rank, rows in sorted(steps_by_rank.items()):
        step_us = round(sum(r.dur_us for r in rows) / len(rows), 3) if rows else None
        comm = [r.comm_us for r in rows if r.comm_us is not None]
        comm_us = round(sum(comm) / len(comm), 3) if comm else None
        stats.append(RankStepStat(rank, len(rows), step_us, comm_us))
    timed = [s for s in stats if s.step_us is not None]
    if not timed:
        return Stragglers(stats, None, None, None, None, None, None, None)
    slow = max(timed, key=lambda s: (s.step_us, -s.rank))
    fast = min(timed, key=lambda s: (s.step_us, s.rank))
    waits = [s for s in stats if s.comm_wait_us is not None]
    least = min(waits, key=lambda s: (s.comm_wait_us, s.rank)).rank if len(waits) > 1 else None
    assert slow.step_us is not None and fast.step_us is not None
    return Stragglers(
        ranks=stats,
        slowest_rank=slow.rank,
        fastest_rank=fast.rank,
        slowest_step_us=slow.step_us,
        fastest_step_us=fast.step_us,
        spread_us=round(slow.step_us - fast.step_us, 3),
        spread_pct=pct(slow.step_us - fast.step_us, fast.step_us),
        least_comm_wait_rank=least,
    )
