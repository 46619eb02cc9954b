"""Small statistics without numpy or `statistics`: np.median, np.quantile and np.unique import numpy.ma on their
first call (10-11 ms here, `python -X importtime`, of an analyze process of 350 ms; tests/cli/test_speed_imports.py
keeps it out), `statistics` imports random, fractions and decimal (3-4 ms)."""

from __future__ import annotations

import math
from collections.abc import Iterable


def quantile(values: list[float] | list[int], q: float) -> float:
    """The q-th quantile (0..1) with linear interpolation, as numpy's default (np.quantile imports numpy.ma on
    its first call: see the module's doc)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("quantile of nothing")
    at = (len(ordered) - 1) * q
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return float(ordered[low] + (ordered[high] - ordered[low]) * (at - low))


def median(values: list[float] | list[int]) -> float:
    """The median, as np.median (the mean of the two middle values for an even count; np.median imports
    numpy.ma on its first call: see the module's doc)."""
    ordered = sorted(values)
    n = len(ordered)
    if not n:
        raise ValueError("median of nothing")
    if n % 2:
        return float(ordered[n // 2])
    return (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def fmean(values: Iterable[float]) -> float:
    """The mean, as statistics.fmean (a correctly rounded sum over the count); `statistics` imports random,
    fractions and decimal (3 ms of a command's start)."""
    items = list(values)
    if not items:
        raise ValueError("mean of nothing")
    return math.fsum(items) / len(items)


def t_sf(t: float, df: int) -> float:
    """P(T >= t) for t >= 0, T ~ Student's t with integer `df` degrees of freedom: (1 - A(t | df)) / 2, A by its
    finite trigonometric series (Abramowitz and Stegun 26.7.3 and 26.7.4)."""
    if math.isinf(t):
        return 0.0
    theta = math.atan(t / math.sqrt(df))
    c2, sin = math.cos(theta) ** 2, math.sin(theta)
    if df % 2:
        term, series = math.cos(theta), 0.0
        for k in range(1, (df - 1) // 2 + 1):  # cos + 2/3 cos^3 + (2 4)/(3 5) cos^5 + ... up to cos^(df-2)
            series += term
            term *= c2 * (2 * k) / (2 * k + 1)
        a = 2.0 / math.pi * (theta + sin * series) if df > 1 else 2.0 * theta / math.pi
    else:
        term, series = 1.0, 0.0
        for k in range(1, df // 2 + 1):  # 1 + 1/2 cos^2 + (1 3)/(2 4) cos^4 + ... up to cos^(df-2)
            series += term
            term *= c2 * (2 * k - 1) / (2 * k)
        a = sin * series
    return float(min(max((1.0 - a) / 2.0, 0.0), 1.0))


def t_quantile(p: float, df: int) -> float:
    """The t with P(T <= t) = p (0.5 <= p < 1), T ~ Student's t with `df` degrees of freedom: t_sf inverted by
    bisection (to 1e-9)."""
    if not 0.5 <= p < 1.0 or df < 1:
        raise ValueError(f"t quantile needs 0.5 <= p < 1 and df >= 1 (p={p}, df={df})")
    low, high = 0.0, 1.0
    while t_sf(high, df) > 1.0 - p:
        high *= 2.0
    while high - low > 1e-9:
        mid = (low + high) / 2.0
        if t_sf(mid, df) > 1.0 - p:
            low = mid
        else:
            high = mid
    return (low + high) / 2.0
