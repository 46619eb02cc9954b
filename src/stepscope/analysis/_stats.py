"""Small statistics without numpy (importing numpy, or np.percentile's numpy.ma, costs readers that need neither)."""

from __future__ import annotations


def quantile(values: list[float] | list[int], q: float) -> float:
    """The q-th quantile (0..1) with linear interpolation, as numpy's default (np.percentile imports numpy.ma,
    ~20 ms, on its first call)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("quantile of nothing")
    at = (len(ordered) - 1) * q
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return float(ordered[low] + (ordered[high] - ordered[low]) * (at - low))
