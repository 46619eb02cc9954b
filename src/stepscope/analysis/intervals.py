"""Vectorised interval arithmetic on integer-ns [start, end) intervals (sort + merge, prefix sums; no Python loops).

Every analyzer measures time as unions of intervals; keeping the arithmetic here makes the definitions
(union, intersection, coverage inside a window) the same everywhere.
"""

from __future__ import annotations

import numpy as np

Intervals = tuple[np.ndarray, np.ndarray]

_EMPTY = np.zeros(0, dtype=np.int64)


def merge(starts: np.ndarray, ends: np.ndarray, *, owned: bool = False) -> Intervals:
    """Union of intervals as disjoint, sorted (starts, ends); touching intervals are joined. `owned`: the
    caller gives up both arrays (int64), which the result may reuse."""
    if len(starts) == 0:
        return _EMPTY, _EMPTY
    # (on big inputs every temporary is tens of MB: they are reused or dropped as soon as they are used, and
    # the groups are picked by masks, not n-long index arrays)
    s = np.asarray(starts, dtype=np.int64)
    e = np.asarray(ends, dtype=np.int64)
    if (s[1:] < s[:-1]).any():
        order = np.argsort(s, kind="stable")
        s, e = s[order], e[order]
        del order
        owned = True
    reach = np.maximum(e, s, out=e if owned else None)
    np.maximum.accumulate(reach, out=reach)
    first = np.empty(len(s), dtype=bool)  # an interval that begins a group
    first[0] = True
    np.greater(s[1:], reach[:-1], out=first[1:])
    if owned and first.all():  # no two intervals meet: the union is the intervals themselves
        return s, reach
    merged_s = s[first]
    last = first  # (reused) an interval that ends a group: the one before the next group's first
    last[:-1] = first[1:]
    last[-1] = True
    return merged_s, reach[last]


def complement(intervals: Intervals, lo: int, hi: int, *, owned: bool = False) -> Intervals:
    """The parts of the window [lo, hi) outside disjoint sorted `intervals` (what subtract gives for one
    window, without its sweep over every boundary). `owned`: the caller gives up both arrays (int64), which
    become the result's (a big trace's host time is two arrays of tens of MB: no second pair is made)."""
    s, e = intervals
    lasting = e > s  # (a zero-length interval takes nothing away)
    if not lasting.all():
        s, e = s[lasting], e[lasting]
        owned = True
    del lasting
    n = len(s)
    if owned and n and s is not e and s.flags.owndata and e.flags.owndata and s.dtype == e.dtype == np.int64:
        gap_s, gap_e = e, s
        del s, e
        gap_e.resize(n + 1, refcheck=False)  # (a realloc: big blocks are remapped, not copied)
        gap_e[-1] = hi
        gap_s.resize(n + 1, refcheck=False)
        _shift_right(gap_s)
        gap_s[0] = lo
    else:
        gap_s = np.empty(n + 1, dtype=np.int64)
        gap_e = np.empty(n + 1, dtype=np.int64)
        gap_s[0], gap_s[1:] = lo, e
        gap_e[:-1], gap_e[-1] = s, hi
    np.clip(gap_s, lo, hi, out=gap_s)
    np.clip(gap_e, lo, hi, out=gap_e)
    keep = gap_e > gap_s
    first, last = int(np.argmax(keep)), len(keep) - int(np.argmax(keep[::-1]))
    if keep[first : max(last, first)].all():  # (the usual case: only the gaps at the ends can be empty)
        return gap_s[first:last], gap_e[first:last]
    return gap_s[keep], gap_e[keep]


_SHIFT_BLOCK = 1 << 16


def _shift_right(a: np.ndarray) -> None:
    """a[1:] = a[:-1], block by block from the end (numpy copies the whole source of an overlapping
    assignment first)."""
    stop = len(a) - 1
    while stop > 0:
        start = max(stop - _SHIFT_BLOCK, 0)
        a[start + 1 : stop + 1] = a[start:stop].copy()
        stop = start


def length(intervals: Intervals) -> int:
    """Total length of disjoint intervals."""
    s, e = intervals
    return int((e - s).sum())


def covered_within(intervals: Intervals, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Length of `intervals` inside each window [lo, hi) (vectorised over windows)."""
    before = _lengths_before(intervals)
    return np.maximum(_coverage_at(intervals, before, hi) - _coverage_at(intervals, before, lo), 0)


def _lengths_before(intervals: Intervals) -> np.ndarray:
    """before[i]: the length of the intervals before the i-th; before[-1]: of all of them. One array as long
    as the set (on a big trace's host ops, tens of MB), computed in place."""
    s, e = intervals
    before = np.empty(len(s) + 1, dtype=np.int64)
    before[0] = 0
    np.subtract(e, s, out=before[1:])
    np.cumsum(before[1:], out=before[1:])
    return before


def _coverage_at(intervals: Intervals, before: np.ndarray, t: np.ndarray) -> np.ndarray:
    s = intervals[0]
    t = np.asarray(t, dtype=np.int64)
    if len(s) == 0:
        return np.zeros(t.shape, dtype=np.int64)
    i = np.searchsorted(s, t, side="right") - 1
    j = np.maximum(i, 0)
    return np.where(i >= 0, before[j] + np.clip(t - s[j], 0, before[j + 1] - before[j]), 0)


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """Intersection of two disjoint sorted interval sets, as disjoint sorted intervals."""
    return _sweep([a, b], lambda mask: mask == 3)


_FEW = 4096  # intervals of `b` up to which subtract goes gap by gap (no sweep over every boundary)


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """The parts of `a` not covered by `b`."""
    if len(a[0]) and len(b[0]) <= _FEW and _disjoint_sorted(a) and _disjoint_sorted(b):
        return _subtract_few(a, b)
    return _sweep([a, b], lambda mask: mask == 1)


def _disjoint_sorted(intervals: Intervals) -> bool:
    s, e = intervals
    return bool((e >= s).all() and (s[1:] >= e[:-1]).all())


def _subtract_few(a: Intervals, b: Intervals) -> Intervals:
    """`subtract` for disjoint sorted sets, `b` of few intervals: the parts of `a` inside each gap of `b`, cut
    straight into the result (the sweep would make several arrays twice as long as `a`)."""
    a_s, a_e = a
    gap_s, gap_e = complement(b, int(a_s[0]), int(a_e[-1]))
    first = np.searchsorted(a_e, gap_s, side="right")  # the first interval of `a` ending after the gap starts
    stop = np.searchsorted(a_s, gap_e, side="left")  # the first starting at or after its end
    total = int(np.maximum(stop - first, 0).sum())
    out_s = np.empty(total, dtype=np.int64)
    out_e = np.empty(total, dtype=np.int64)
    at = 0
    for g_s, g_e, i, j in zip(gap_s.tolist(), gap_e.tolist(), first.tolist(), stop.tolist(), strict=True):
        if j > i:
            np.maximum(a_s[i:j], g_s, out=out_s[at : at + j - i])
            np.minimum(a_e[i:j], g_e, out=out_e[at : at + j - i])
            at += j - i
    keep = out_e > out_s
    if not keep.all():
        out_s, out_e = out_s[keep], out_e[keep]
    del keep
    if len(out_s) > 1 and (out_s[1:] == out_e[:-1]).any():  # (touching parts, from touching intervals of `a`)
        return merge(out_s, out_e, owned=True)
    return out_s, out_e


def overlapping(intervals: Intervals, lo: int, hi: int) -> Intervals:
    """The intervals of a disjoint sorted set that reach into [lo, hi), uncut: views, found by two binary
    searches (what one op's subtract or intersect needs of a set as long as the trace, at O(log n))."""
    s, e = intervals
    first = int(np.searchsorted(e, lo, side="right"))
    stop = max(int(np.searchsorted(s, hi, side="left")), first)
    return s[first:stop], e[first:stop]


def subtract_each(
    starts: np.ndarray, ends: np.ndarray, b: Intervals
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each interval [starts[i], ends[i]) less the disjoint sorted set `b`, all at once (the intervals may
    overlap one another): (part starts, part ends, i of each part), by i, then by time. One binary search per
    interval: what a subtract per interval gives, without a call per interval."""
    s = np.asarray(starts, dtype=np.int64)
    e = np.asarray(ends, dtype=np.int64)
    if not len(s):
        return _EMPTY, _EMPTY, _EMPTY
    gap_s, gap_e = complement(b, int(s.min()), int(e.max()))
    first = np.searchsorted(gap_e, s, side="right")  # the first gap ending after the interval starts
    count = np.maximum(np.searchsorted(gap_s, e, side="left") - first, 0)
    owner = np.repeat(np.arange(len(s), dtype=np.int64), count)
    gap = np.arange(len(owner), dtype=np.int64) + np.repeat(first - (np.cumsum(count) - count), count)
    part_s = np.maximum(gap_s[gap], s[owner])
    part_e = np.minimum(gap_e[gap], e[owner])
    keep = part_e > part_s
    return part_s[keep], part_e[keep], owner[keep]


def clip(intervals: Intervals, lo: int, hi: int, *, owned: bool = False) -> Intervals:
    """Disjoint intervals cut to the window [lo, hi). `owned`: the caller gives up the arrays (int64), which
    the result may reuse."""
    s, e = intervals
    s2 = np.maximum(s, lo, out=s if owned else None)
    e2 = np.minimum(e, hi, out=e if owned else None)
    keep = e2 > s2
    if owned and keep.all():
        return s2, e2
    return s2[keep], e2[keep]


def exclusive_time_by_mask(sets: list[Intervals]) -> np.ndarray:
    """Time during which exactly the combination `mask` of the given disjoint sets is active.

    Index the result with a bit mask (bit i = sets[i]); entry 0 is unused. Used for "compute overlapping
    communication"-style breakdowns.
    """
    times, bits = _boundaries(sets)
    out = np.zeros(1 << len(sets), dtype=np.int64)
    if len(times) < 2:
        return out
    mask = np.cumsum(bits)[:-1]
    out += np.bincount(mask, weights=np.diff(times), minlength=len(out)).astype(np.int64)
    out[0] = 0
    return out


def _boundaries(sets: list[Intervals]) -> tuple[np.ndarray, np.ndarray]:
    """Start/end boundaries of several disjoint interval sets, sorted by time; bit values +2^i / -2^i
    (int16 for fewer than 15 sets: on big sets every array here is tens of MB)."""
    if not sets:
        return _EMPTY, _EMPTY
    if len(sets) == 2:
        return _two_boundaries(*sets)
    t = np.concatenate([x for s, e in sets for x in (s, e)]).astype(np.int64, copy=False)
    b = np.empty(len(t), dtype=np.int16 if len(sets) < 15 else np.int64)
    at = 0
    for i, (s, e) in enumerate(sets):
        b[at : at + len(s)] = 1 << i
        b[at + len(s) : at + len(s) + len(e)] = -(1 << i)
        at += len(s) + len(e)
    order = np.argsort(t, kind="stable")
    t = t[order]
    b = b[order]
    return t, b


def _two_boundaries(a: Intervals, b: Intervals) -> tuple[np.ndarray, np.ndarray]:
    """`_boundaries` of two sets, by merging their sorted boundaries instead of sorting them all. A disjoint
    sorted set's boundaries are in order as start, end, start, end...; where times tie the order may differ
    from the sort's, which changes only zero-length stretches of the sweep (dropped there)."""
    ta, ba = _own_boundaries(a, 1)
    tb, bb = _own_boundaries(b, 2)
    if not (np.diff(ta) >= 0).all() or not (np.diff(tb) >= 0).all():  # not disjoint and sorted: sort them
        t = np.concatenate((ta, tb))
        order = np.argsort(t, kind="stable")
        return t[order], np.concatenate((ba, bb))[order]
    at_b = np.searchsorted(ta, tb, side="right") + np.arange(len(tb))  # where b's boundaries go
    t = np.empty(len(ta) + len(tb), dtype=np.int64)
    bits = np.empty(len(t), dtype=np.int16)
    is_a = np.ones(len(t), dtype=bool)
    is_a[at_b] = False
    t[at_b], bits[at_b] = tb, bb
    t[is_a], bits[is_a] = ta, ba
    return t, bits


def _own_boundaries(intervals: Intervals, bit: int) -> tuple[np.ndarray, np.ndarray]:
    s, e = intervals
    t = np.empty(2 * len(s), dtype=np.int64)
    t[0::2], t[1::2] = s, e
    bits = np.empty(len(t), dtype=np.int16)
    bits[0::2], bits[1::2] = bit, -bit
    return t, bits


def _sweep(sets: list[Intervals], keep: object) -> Intervals:
    times, bits = _boundaries(sets)
    if len(times) < 2:
        return _EMPTY, _EMPTY
    mask = np.cumsum(bits, dtype=bits.dtype)[:-1]  # the sets open after each boundary
    del bits
    sel = keep(mask) & (times[1:] > times[:-1])  # type: ignore[operator]
    del mask
    return merge(times[:-1][sel], times[1:][sel])
