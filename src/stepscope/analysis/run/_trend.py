"""The step-time trend of a run: a Theil-Sen slope over the plain steps, reported only when a Mann-Kendall test
says it is there and it moves the step by a visible amount.

Both are rank-based: a few slow steps (a checkpoint, a step after a sleep, another job on the machine) move
neither the slope (the median of the slopes between every two steps) nor the test (the signs of the differences
between every two steps), where the median of the last quarter of steps against the first moved a flat job by
-50% and a 15-step run by +2272%.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise

from stepscope.analysis.stats import median

MIN_TREND_STEPS = 12  # fewer plain steps: too few pairs to tell a trend from a few slow steps
TREND_P_VALUE = 0.001  # two-sided; stricter than 0.01 because a shared machine's noise comes in bursts
MIN_TREND_PCT = 5.0  # a smaller change over the whole run is within what other work on the machine moves it
MAX_TREND_POINTS = 256  # longer runs are tested on the medians of this many consecutive blocks of steps


@dataclass(frozen=True)
class Trend:
    """How the step time moved over a run's plain steps."""

    steps: int  # plain steps
    points: int  # values tested: the steps, or block medians of a long run
    slope_ms_per_step: float  # Theil-Sen: the median of the slopes between every two points
    change_ms: float  # slope x (last plain step - first plain step)
    change_pct: float  # change_ms in % of the median plain step
    p_value: float  # Mann-Kendall, two-sided

    @property
    def reported(self) -> bool:
        """Significant, and large enough to matter."""
        return self.p_value < TREND_P_VALUE and abs(self.change_pct) >= MIN_TREND_PCT


def step_trend(steps: list[int], wall_ms: list[float]) -> Trend | None:
    """The trend of `wall_ms` over `steps` (same length, steps increasing); None below MIN_TREND_STEPS or when
    the median step takes no time."""
    n = len(steps)
    if n < MIN_TREND_STEPS or n != len(wall_ms):
        return None
    typical = median(wall_ms)
    if typical <= 0:
        return None
    xs, ys = _blocks(steps, wall_ms)
    slope = _theil_sen(xs, ys)
    if slope is None:
        return None
    change = slope * (steps[-1] - steps[0])
    return Trend(n, len(xs), slope, change, 100.0 * change / typical, _mann_kendall_p(ys))


def _blocks(steps: list[int], wall_ms: list[float]) -> tuple[list[float], list[float]]:
    """At most MAX_TREND_POINTS (step, wall) points: each a block of consecutive steps' medians (both tests
    look at every pair of points: a long run's 100,000 steps would be 5e9 pairs)."""
    n = len(steps)
    if n <= MAX_TREND_POINTS:
        return [float(s) for s in steps], list(wall_ms)
    bounds = [round(i * n / MAX_TREND_POINTS) for i in range(MAX_TREND_POINTS + 1)]
    xs = [median(steps[a:b]) for a, b in pairwise(bounds)]
    ys = [median(wall_ms[a:b]) for a, b in pairwise(bounds)]
    return xs, ys


def _theil_sen(xs: list[float], ys: list[float]) -> float | None:
    """The median of the slopes between every two points at different steps; None when there are none."""
    n = len(xs)
    slopes = [(ys[j] - ys[i]) / (xs[j] - xs[i]) for i in range(n) for j in range(i + 1, n) if xs[j] != xs[i]]
    return median(slopes) if slopes else None


def _mann_kendall_p(values: list[float]) -> float:
    """Two-sided p-value of Mann-Kendall's S: the normal approximation with the tie and continuity corrections
    (within a few % of the exact p from 10 values on)."""
    n = len(values)
    s = 0
    for i in range(n):
        for j in range(i + 1, n):
            s += (values[j] > values[i]) - (values[j] < values[i])
    ties: dict[float, int] = {}
    for v in values:
        ties[v] = ties.get(v, 0) + 1
    variance = (n * (n - 1) * (2 * n + 5) - sum(t * (t - 1) * (2 * t + 5) for t in ties.values())) / 18
    if variance <= 0 or s == 0:
        return 1.0
    z = (abs(s) - 1) / math.sqrt(variance)
    return math.erfc(z / math.sqrt(2))
