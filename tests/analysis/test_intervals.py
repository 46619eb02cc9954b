"""Interval arithmetic against a brute-force model: one boolean per ns."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from stepscope.analysis import intervals as iv

SIZE = 200
spans = st.lists(st.tuples(st.integers(0, SIZE), st.integers(0, 40)), max_size=12)


def arrays(pairs: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    s = np.array([a for a, _ in pairs], dtype=np.int64)
    return s, s + np.array([d for _, d in pairs], dtype=np.int64)


def bitmap(pairs: list[tuple[int, int]]) -> np.ndarray:
    bits = np.zeros(SIZE + 41, dtype=bool)
    for a, d in pairs:
        bits[a : a + d] = True
    return bits


@settings(max_examples=200, deadline=None)
@given(spans, spans, st.integers(0, SIZE), st.integers(0, SIZE))
def test_against_bitmap(a: list[tuple[int, int]], b: list[tuple[int, int]], lo: int, width: int) -> None:
    ua, ub = iv.merge(*arrays(a)), iv.merge(*arrays(b))
    ba, bb = bitmap(a), bitmap(b)
    assert iv.length(ua) == ba.sum()
    assert np.all(ua[0][1:] > ua[1][:-1])  # disjoint, sorted, not touching
    for got, expected in ((iv.intersect(ua, ub), ba & bb), (iv.subtract(ua, ub), ba & ~bb)):
        assert iv.length(got) == expected.sum()
        assert np.array_equal(
            bitmap(list(zip(got[0].tolist(), (got[1] - got[0]).tolist(), strict=True))), expected
        )
        assert np.all(got[0][1:] > got[1][:-1]) and np.all(got[1] > got[0])  # disjoint, sorted, not touching
    hi = lo + width
    assert iv.covered_within(ua, np.array([lo]), np.array([hi]))[0] == ba[lo:hi].sum()
    assert iv.length(iv.clip(ua, lo, hi)) == ba[lo:hi].sum()
    excl = iv.exclusive_time_by_mask([ua, ub])
    assert (excl[1], excl[2], excl[3]) == ((ba & ~bb).sum(), (~ba & bb).sum(), (ba & bb).sum())


def test_empty_inputs() -> None:
    empty = iv.merge(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    assert iv.length(empty) == 0
    assert iv.covered_within(empty, np.array([0]), np.array([10])).tolist() == [0]
    assert iv.exclusive_time_by_mask([empty, empty]).tolist() == [0, 0, 0, 0]


windows = st.lists(st.tuples(st.integers(-10, SIZE + 50), st.integers(-5, SIZE)), min_size=1, max_size=60)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, SIZE), st.integers(0, 12)), max_size=30), windows, st.booleans())
def test_covered_within_many_windows(
    a: list[tuple[int, int]], w: list[tuple[int, int]], ordered: bool
) -> None:
    # windows in trace order (sorted starts) or not, short ones and ones across many intervals, empty and reversed
    if ordered:
        w = sorted(w)
    union, bits = iv.merge(*arrays(a)), bitmap(a)
    lo = np.array([start for start, _ in w], dtype=np.int64)
    hi = lo + np.array([width for _, width in w], dtype=np.int64)
    expected = [int(bits[max(x, 0) : max(y, 0)].sum()) if y > x else 0 for x, y in zip(lo, hi, strict=True)]
    assert iv.covered_within(union, lo, hi).tolist() == expected


@settings(max_examples=200, deadline=None)
@given(spans, spans, st.integers(0, SIZE), st.integers(0, SIZE))
def test_subtract_each_and_overlapping_against_bitmap(
    a: list[tuple[int, int]], b: list[tuple[int, int]], lo: int, width: int
) -> None:
    # GIVEN intervals that may overlap one another, and a disjoint sorted set
    ub = iv.merge(*arrays(b))
    bb = bitmap(b)
    # WHEN each interval has the set taken from it at once
    part_s, part_e, owner = iv.subtract_each(*arrays(a), ub)
    # THEN each interval's parts are exactly its ns outside the set, in order, and none is empty
    assert np.all(part_e > part_s) and np.all(np.diff(owner) >= 0)
    for i, (start, dur) in enumerate(a):
        mine = owner == i
        expected = np.zeros_like(bb)
        expected[start : start + dur] = True
        expected &= ~bb
        got = bitmap(list(zip(part_s[mine].tolist(), (part_e[mine] - part_s[mine]).tolist(), strict=True)))
        assert np.array_equal(got, expected)
        assert np.all(part_s[mine][1:] >= part_e[mine][:-1])
    # AND the set's intervals reaching into a window are those a scan finds
    hi = lo + width
    near = iv.overlapping(ub, lo, hi)
    scan = [(s, e) for s, e in zip(*(x.tolist() for x in ub), strict=True) if e > lo and s < hi]
    assert list(zip(near[0].tolist(), near[1].tolist(), strict=True)) == scan
