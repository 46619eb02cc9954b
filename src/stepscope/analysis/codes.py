"""np.unique(values, return_inverse=True) for the integer columns analyses group by, without a sort of the rows.

Name codes, stream ids and step numbers take few distinct values or lie in a small range; a presence table
(small range) or a hash of the distinct values (few of them) groups them in linear time. The result is the
one np.unique gives: the distinct values ascending, and each row's index among them.
"""

from __future__ import annotations

import numpy as np

_FEW = 4096  # distinct values found by hashing and then looked up by binary search, at most


def unique_inverse(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct values ascending, index of each value among them) of a 1-d integer array."""
    values = np.asarray(values)
    if len(values) == 0 or values.dtype.kind not in "iu":
        uniq, inverse = np.unique(values, return_inverse=True)
        return uniq, inverse.reshape(-1)
    lo, hi = int(values.min()), int(values.max())
    if hi - lo < max(len(values), 1 << 16):  # a small range: a table of the values present
        shifted = values - np.asarray(lo).astype(values.dtype) if lo else values
        present = np.zeros(hi - lo + 1, dtype=bool)
        present[shifted] = True
        lookup = np.cumsum(present, dtype=np.intp) - 1
        uniq = (np.flatnonzero(present) + lo).astype(values.dtype)
        return uniq, lookup[shifted]
    try:
        distinct = np.unique(values, sorted=False)  # numpy >= 2.3: hashing, no sort of the rows
    except TypeError:
        distinct = None
    if distinct is not None and len(distinct) <= _FEW:
        distinct.sort()
        return distinct, np.searchsorted(distinct, values).astype(np.intp, copy=False)
    uniq, inverse = np.unique(values, return_inverse=True)
    return uniq, inverse.reshape(-1)


def distinct_sorted(values: np.ndarray) -> np.ndarray:
    """The distinct values of a 1-d array, ascending (np.unique without its return arrays, which in numpy 2.4
    imports numpy.ma on first use: 10-11 ms of analyze's start, measured with `python -X importtime`)."""
    ordered = np.sort(np.asarray(values).reshape(-1))
    if len(ordered) < 2:
        return ordered
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]
