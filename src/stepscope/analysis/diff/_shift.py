"""How much a measure moved between two runs, with the uncertainty the runs' own spread gives it.

`shift(base, test)` is the Hodges-Lehmann estimate of the shift (the median of every difference between a test
value and a base value) with its distribution-free 95% interval (Moses): the interval between two order
statistics of those differences, which rank a Mann-Whitney test puts at its 2.5% critical value. The shift is
*significant* when the interval excludes zero, which is the rank test rejecting "no change" at 5% (two-sided).
No assumption on the shape of the distributions, robust to the odd slow step, deterministic (no resampling), and
honest with few values: with 3 and 3 the interval is unbounded, as no rank test can reject at 5% there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec
import numpy as np

from stepscope.analysis.stats import quantile

Z_975 = 1.959963984540054  # the standard normal's 97.5% quantile
# The pairwise differences are n * m values; past this many each side is thinned to evenly spaced values.
MAX_PAIRS = 1_000_000


class Shift(msgspec.Struct):
    """test - base: the estimate and its 95% interval (null where too few values bound it)."""

    estimate: float | None  # Hodges-Lehmann shift; null without values on a side
    low: float | None
    high: float | None
    significant: bool  # the interval excludes 0
    base_n: int
    test_n: int


def shift(base: Sequence[float], test: Sequence[float]) -> Shift:
    """The shift from `base` to `test` with its 95% interval; see the module's docstring."""
    b, t = _thinned(np.asarray(base, dtype=np.float64)), _thinned(np.asarray(test, dtype=np.float64))
    if not len(b) or not len(t):
        return Shift(None, None, None, False, len(base), len(test))
    pairs = np.sort(np.subtract.outer(t, b).ravel())
    estimate = float(_middle(pairs))
    k = critical_rank(len(b), len(t))
    if k < 0:
        return Shift(estimate, None, None, False, len(base), len(test))
    low, high = float(pairs[k]), float(pairs[len(pairs) - 1 - k])
    return Shift(estimate, low, high, low > 0 or high < 0, len(base), len(test))


def critical_rank(n: int, m: int) -> int:
    """K such that the 95% interval of the shift is [D(K+1), D(nm-K)] of the nm sorted differences (0-based:
    pairs[K] and pairs[nm-1-K]); -1 when no interval at 95% exists. The Mann-Whitney U statistic's normal
    approximation with a continuity correction: against the exact distribution of U it is never narrower for
    any n, m from 2 to 40 and at most one rank wider (tests/analysis/test_diff_stats.py checks it)."""
    mean = n * m / 2
    sd = math.sqrt(n * m * (n + m + 1) / 12)
    return math.floor(mean - 0.5 - Z_975 * sd)


def _middle(ordered: np.ndarray) -> float:
    """The median of sorted values (np.median would import numpy.ma, ~20 ms, for nothing more)."""
    n = len(ordered)
    return float(ordered[n // 2]) if n % 2 else float(ordered[n // 2 - 1] + ordered[n // 2]) / 2


def _thinned(values: np.ndarray) -> np.ndarray:
    """At most sqrt(MAX_PAIRS) values, evenly spaced in order of arrival, so that n * m stays bounded."""
    most = math.isqrt(MAX_PAIRS)
    if len(values) <= most:
        return values
    return values[np.linspace(0, len(values) - 1, most).round().astype(np.int64)]


Z_9875 = 2.241402727604947  # the standard normal's 98.75% quantile: two 97.5% intervals make one of 95%
MIN_QUANTILE_VALUES = 20  # per side, for the interval of a low quantile


def quantile_shift(base: Sequence[float], test: Sequence[float], q: float) -> Shift:
    """test - base of the q-quantile (0..1) with a conservative 95% interval: each side's distribution-free 97.5%
    interval of its quantile (two order statistics, by the binomial's normal approximation), the one's low end
    less the other's high end and the other way round. Null bounds with fewer than MIN_QUANTILE_VALUES a side."""
    b, t = np.sort(np.asarray(base, dtype=np.float64)), np.sort(np.asarray(test, dtype=np.float64))
    if not len(b) or not len(t):
        return Shift(None, None, None, False, len(b), len(t))
    estimate = quantile(t.tolist(), q) - quantile(b.tolist(), q)
    if min(len(b), len(t)) < MIN_QUANTILE_VALUES:
        return Shift(estimate, None, None, False, len(b), len(t))
    (b_low, b_high), (t_low, t_high) = _quantile_bounds(b, q), _quantile_bounds(t, q)
    low, high = t_low - b_high, t_high - b_low
    return Shift(estimate, low, high, low > 0 or high < 0, len(b), len(t))


def _quantile_bounds(ordered: np.ndarray, q: float) -> tuple[float, float]:
    n = len(ordered)
    centre, half = n * q, Z_9875 * math.sqrt(n * q * (1 - q))
    return float(ordered[max(math.floor(centre - half), 0)]), float(
        ordered[min(math.ceil(centre + half), n - 1)]
    )


ONE_SIDED_ALPHA = 0.05  # the exact test's level: 3 values against 3, every one beyond, is p = 1/20
MAX_EXACT_PAIRS = 2_500  # n * m past which the exact null distribution is not needed (the interval exists)


def beyond_p(base: Sequence[float], test: Sequence[float], offset: float) -> float:
    """One-sided exact p-value of the Mann-Whitney test that TEST less `offset` lies above BASE: the chance, were
    both sets drawn alike, of at least as many (test - offset, base) pairs with the test value strictly above
    (a tie counts against). Every test value beyond every base value, 3 against 3, is p = 1/20 = 0.05.
    For few values, where the interval of `shift` is unbounded; 1.0 past MAX_EXACT_PAIRS pairs or without values."""
    n, m = len(base), len(test)
    if not n or not m or n * m > MAX_EXACT_PAIRS:
        return 1.0
    b = np.asarray(base, dtype=np.float64)
    t = np.asarray(test, dtype=np.float64) - offset
    above = int((t[:, None] > b[None, :]).sum())
    counts = _u_counts(n, m)
    return float(counts[above:].sum() / counts.sum())


def _u_counts(n: int, m: int) -> np.ndarray:
    """How many of the C(n+m, n) orderings of n base and m test values give each count u = 0..n*m of
    (test > base) pairs: c(n, m, u) = c(n, m-1, u-n) + c(n-1, m, u) (the largest value is a test one, above all
    n base values, or a base one, above every test value)."""
    previous = [np.ones(1, dtype=np.float64) for _ in range(m + 1)]  # c(0, j, .): one ordering, no pair
    for i in range(1, n + 1):
        current = [np.ones(1, dtype=np.float64)]  # c(i, 0, .)
        for j in range(1, m + 1):
            out = np.zeros(i * j + 1, dtype=np.float64)
            out[i : i + len(current[j - 1])] += current[j - 1]
            out[: len(previous[j])] += previous[j]
            current.append(out)
        previous = current
    return previous[m]
