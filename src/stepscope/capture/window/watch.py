"""The watch on every step (issue 45): a rank's own step time, learned while nothing happens, and the steps that
are slower than the job's own noise allows.

Learning: the wall times of the last `history` plain steps, their median and their upper spread (how far their
0.9 quantile lies above the median, in a normal distribution's standard deviations: step times lean right, so the
spread below the median says little about the long steps), recomputed every `every` steps.
A step is *slow* when it takes longer than

    median + max(sigmas x spread, floor x median, floor_ms)

(`sigmas` follows the job's noise; `floor` keeps a job with almost no noise from calling a 5% wobble slow, and
`floor_ms` a job of 1 ms steps from calling the OS's scheduling slow). An *anomaly* is a stretch of `in_a_row`
slow steps (one plain step between two slow ones does not end a stretch: a noisy job's slow phase has steps that
dip under the bound); one step over the median by at least (`big` - 1) x the median, `spike_ms` and 4 x sigmas x
spread (the job's own tail: a noisy job's rare long step is no anomaly); or slow steps that
recur: the last `in_a_row` + 1 stretches of slow steps began equally spaced (within one step), the period of a
checkpoint, a GC pass or an evaluation (a busy machine's stalls do not keep time). Until
`min_history` steps are learned nothing is slow. Every step is learned: a slow stretch shorter than half the
history barely moves the median, and a lasting change becomes the norm after about half the history.

The cost while nothing happens is the caller's one comparison per step (`over_ns`, the slow bound in ns: a step
at or below it needs no call) and a refresh every `every` steps (a sort of `history` values). Periodic slowness is
recognised from the slow stretches' first steps (`period`): `in_a_row` + 1 starts equally spaced (within one step)
give the period and the next occurrence's first step.

Chosen on step times recorded here and checked on others recorded after the choice: 13 steady CPU jobs of 2,000
steps (1, 6 and 12 ms steps; 11 of them beside a process that keeps one of the 2 cores busy, with single steps of
10-50 ms from the OS's scheduling and stretches at 1.6x) have no anomaly with the defaults; on lognormal noise,
1 in 100 runs of 2,000 steps has one at a spread of 0.3, 2 in 100 at 0.5. A slowdown is found when it makes steps
1.5x their median or more: 5 steps 50 ms slower are found by their fourth in a job of 1-50 ms steps
(tests/capture/test_watch.py). `spike_ms` was 50 at first: a steady 2-rank gloo job beside a busy core then had
a single OS stall of 52 ms over its 11.6 ms median in 1 of 5 runs of 2,000 steps (benchmarks/bench_watch.py), and
a single stall of a recurring kind opened a window too late to record it; at 100 ms such stalls wait for the
recurrence rule, which records the next one from its first step.

No torch, no I/O: the monitor feeds it and acts on what it says.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass

_NEVER = 1 << 62  # the slow bound before anything is learned (no step is slower)
_Q90_SIGMAS = 1.2816  # the 0.9 quantile of a normal distribution, in standard deviations above its median


@dataclass(frozen=True)
class Anomaly:
    """Steps `first`..`last` were slow: `factor` x the median (the largest of them), `why` in words."""

    first: int
    last: int
    factor: float
    median_ms: float
    why: str


class StepWatch:
    """See the module's doc. `learn(wall_ns)` every plain step (or `learn_many`), `refresh()` every `every`
    steps, `slow(step, wall_ns)` for a step over `over_ns`."""

    def __init__(
        self,
        *,
        history: int = 64,
        every: int = 16,
        sigmas: float = 4.0,
        floor: float = 0.5,
        floor_ms: float = 5.0,
        in_a_row: int = 3,
        big: float = 3.0,
        spike_ms: float = 100.0,
        min_history: int = 24,
    ) -> None:
        if history < 8 or every < 1 or in_a_row < 2 or big <= 1 or sigmas <= 0 or floor < 0 or floor_ms < 0:
            raise ValueError(
                "watch: history >= 8, every >= 1, in_a_row >= 2, big > 1, sigmas > 0, floor >= 0, floor_ms >= 0"
            )
        self.every, self.sigmas, self.floor = every, sigmas, floor
        self._floor_ns, self._spike_ns = floor_ms * 1e6, spike_ms * 1e6
        self.in_a_row, self.big, self.min_history = in_a_row, big, min(min_history, history)
        self._walls: deque[int] = deque(maxlen=history)
        self.median_ns = 0.0
        self.spread_ns = 0.0
        self.over_ns = _NEVER  # a step above it is slow
        self._big_ns = _NEVER
        self._run_first = -2  # the first and last step of the current run of slow steps
        self._run_last = -2
        self._run_worst = 0
        self._run_count = 0  # slow steps in it
        self._told = False  # the current run was reported
        self._starts: deque[int] = deque(
            maxlen=in_a_row + 1
        )  # the first steps of the last stretches of slow steps
        self.anomalies: list[Anomaly] = []

    # --- learning ------------------------------------------------------------------------------------------
    def learn(self, wall_ns: int) -> None:
        self._walls.append(wall_ns)

    def learn_many(self, walls_ns: list[int]) -> None:
        self._walls.extend(walls_ns)

    def refresh(self) -> None:
        """The median, spread and slow bound from the steps learned (nothing is slow before `min_history`)."""
        n = len(self._walls)
        if n < self.min_history:
            return
        ordered = sorted(self._walls)
        median = _median(ordered)
        self.median_ns = median
        # the upper spread: step times lean right (a step is rarely much faster than its median, often slower)
        self.spread_ns = (_quantile(ordered, 0.9) - median) / _Q90_SIGMAS
        self.over_ns = int(median + max(self.sigmas * self.spread_ns, self.floor * median, self._floor_ns))
        excess = max((self.big - 1) * median, self._spike_ns, 4 * self.sigmas * self.spread_ns)
        self._big_ns = int(median + excess)

    # --- slow steps ----------------------------------------------------------------------------------------
    def slow(self, step: int, wall_ns: int) -> Anomaly | None:
        """Step `step` took `wall_ns` (more than `over_ns`): the anomaly it completes, else None."""
        if wall_ns <= self.over_ns:
            return None
        if step <= self._run_last + 2:  # (one plain step between two slow ones does not end a stretch)
            self._run_last, self._run_worst = step, max(self._run_worst, wall_ns)
            self._run_count += 1
        else:
            self._run_first = self._run_last = step
            self._run_worst, self._run_count, self._told = wall_ns, 1, False
            self._starts.append(step)
        if self._told:
            return None
        length = self._run_count
        factor = self._run_worst / self.median_ns
        median_ms = self.median_ns / 1e6
        every = self._period(self.in_a_row + 1)
        if wall_ns > self._big_ns:
            why = f"step {step} took {wall_ns / self.median_ns:.1f}x the median step of {median_ms:.1f} ms"
        elif length >= self.in_a_row:
            span = self._run_last - self._run_first + 1
            why = (
                f"{length} slow steps in {span} ({self._run_first}-{self._run_last}) over the slow bound "
                f"{self.over_ns / 1e6:.1f} ms (median {median_ms:.1f} ms, up to {factor:.1f}x)"
            )
        elif every is not None:
            why = (
                f"slow steps every {every} steps (from steps {', '.join(map(str, self._starts))}), "
                f"up to {factor:.1f}x the median step ({median_ms:.1f} ms)"
            )
        else:
            return None
        self._told = True
        anomaly = Anomaly(self._run_first, self._run_last, round(factor, 2), median_ms, why)
        self.anomalies.append(anomaly)
        return anomaly

    # --- periodic slowness ---------------------------------------------------------------------------------
    @property
    def starts(self) -> list[int]:
        """The first steps of the last slow stretches (at most `in_a_row` + 1), oldest first."""
        return list(self._starts)

    def period(self) -> tuple[int, int] | None:
        """(period, the next occurrence's first step) when the last `in_a_row` + 1 stretches of slow steps began
        equally spaced (within one step), else None. The next occurrence keeps the phase most of them share: a
        stretch that began a step early (a step of noise just over the bound) does not shift it."""
        every = self._period(self.in_a_row + 1)
        if every is None:
            return None
        last = self._starts[-1]
        # each start's offset from the last one's phase, in (-every/2, every/2]
        offsets = sorted(((s - last) + every // 2) % every - every // 2 for s in self._starts)
        return every, last + round(_median(offsets)) + every

    def _period(self, count: int) -> int | None:
        starts = list(self._starts)[-count:]
        if len(starts) < count:
            return None
        gaps = [b - a for a, b in itertools.pairwise(starts)]
        if min(gaps) < 2 or max(gaps) - min(gaps) > 1:
            return None
        return round(sum(gaps) / len(gaps))


def _quantile(ordered: list[int], q: float) -> float:
    """The q-quantile of sorted values, interpolated linearly (numpy's default)."""
    at = q * (len(ordered) - 1)
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def _median(ordered: list[float] | list[int]) -> float:
    n = len(ordered)
    mid = n // 2
    return float(ordered[mid]) if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


__all__ = ["Anomaly", "StepWatch"]
