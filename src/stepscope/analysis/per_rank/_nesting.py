"""The nesting of a thread's intervals: each one's innermost enclosing interval, as one pass with a stack of the
open intervals gives it, computed piece by piece so that the temporaries stay small on traces of millions of
events.

Intervals come grouped by thread, each thread's in order of start, longest first. A thread's intervals fall into
groups: a group begins where an interval starts once every earlier interval of the thread has ended (the stack
is empty there), so no interval of one group holds one of another. A piece is a run of whole groups of one
thread, about `PIECE` intervals long where the groups allow; each piece is solved on its own. A group longer than
that (a whole trace under one step annotation) is solved a stretch at a time, each stretch with the intervals still
open where it begins (the stack there: the chain of enclosing intervals, a few) put before it.
"""

from __future__ import annotations

import itertools

import numpy as np

PIECE = 1 << 16  # intervals per piece, where groups end often enough (a piece is never cut inside a group)
_DEEPEST = (
    4096  # the most open intervals a stretch of a long group is solved with (deeper: the group at once)
)


def tree_parents(
    start: np.ndarray, end: np.ndarray, new_thread: np.ndarray, dtype: type = np.int64
) -> tuple[np.ndarray, bool]:
    """Index of each interval's innermost enclosing interval (-1: none), as `dtype`, and whether every thread's
    intervals nest (each inside its parent, siblings apart). Intervals sorted by thread (`new_thread`: True where
    one begins), start, then longest first."""
    n = len(start)
    parent: np.ndarray = np.full(n, -1, dtype=dtype)
    nested = True
    cuts = piece_bounds(start, end, new_thread)
    for a, b in itertools.pairwise(cuts):
        if b - a == 1:
            continue
        s, e = start[a:b], end[a:b]
        found = nested_parents(s, e) if b - a <= 2 * PIECE else _stretch_parents(s, e)
        if found is None:
            nested = False
            found = parents_loop(s, e)
        found[found >= 0] += a
        parent[a:b] = found
    return parent, nested


def piece_bounds(start: np.ndarray, end: np.ndarray, new_thread: np.ndarray) -> list[int]:
    """Where pieces begin, then len(start): every thread's first interval, and in each stretch of `PIECE`
    intervals of a thread the first one that begins a group."""
    n = len(start)
    if n == 0:
        return [0]
    threads = np.flatnonzero(new_thread).tolist()
    if not threads or threads[0] != 0:
        threads.insert(0, 0)
    cuts: list[int] = []
    for a, b in zip(threads, [*threads[1:], n], strict=True):
        cuts.append(a)
        reach = None  # the latest end of the thread's intervals before the stretch
        for lo in range(a, b, PIECE):
            hi = min(lo + PIECE, b)
            ends = np.maximum.accumulate(end[lo:hi])
            if reach is not None:
                np.maximum(ends, reach, out=ends)
                # a group begins at k when nothing before k ends after its start
                before = np.empty_like(ends)
                before[0] = reach
                before[1:] = ends[:-1]
                begins = np.flatnonzero(start[lo:hi] >= before)
                if len(begins) and lo + int(begins[0]) > cuts[-1]:
                    cuts.append(lo + int(begins[0]))
            reach = ends[-1]
    cuts.append(n)
    return cuts


def nested_parents(s: np.ndarray, e: np.ndarray) -> np.ndarray | None:
    """The parents (int64) of intervals of one thread when they nest; None when they do not.

    Vectorized: the depth of an interval is the number of intervals still open when it starts (earlier ones
    with a duration, less those that ended by then), and its parent the last earlier interval one level up.
    That is the stack's answer when the intervals nest (each inside its parent, siblings apart), which is
    checked."""
    n = len(s)
    lasting = e > s  # only an interval with a duration can hold another
    # (the sorts are stable: timsort and radix sort are quick on what is almost in order, or small ints)
    ends = np.sort(e[lasting], kind="stable")
    depth = np.searchsorted(ends, s, side="right")  # lasting ones ended by each start
    del ends
    before: np.ndarray = np.cumsum(lasting) - lasting  # lasting intervals earlier in the order
    np.subtract(before, depth, out=depth)  # the depth: lasting ones still open
    del before
    # the parent: the last earlier lasting interval of depth - 1. By depth, then position: `key`, ascending
    by_depth = np.argsort(depth.astype(np.int16) if depth.max() < 2**15 else depth, kind="stable")
    key = depth[by_depth] * (n + 1) + by_depth
    candidates = key[lasting[by_depth]]
    if not len(candidates):  # nothing lasts: nothing holds anything
        return np.full(n, -1, dtype=np.int64)
    key -= n + 1
    at = np.searchsorted(candidates, key, side="left")
    del key
    at -= 1
    found = at >= 0
    np.maximum(at, 0, out=at)
    hit = candidates[at]
    del at, candidates
    found &= hit // (n + 1) == depth[by_depth] - 1
    parent = np.full(n, -1, dtype=np.int64)
    parent[by_depth[found]] = hit[found] % (n + 1)
    del hit, found, by_depth
    if ((depth > 0) & (parent < 0)).any():
        return None
    del depth
    # check that this tree nests: each interval inside its parent (and opened while it is open), siblings
    # (the same parent, in order of start) apart from each other
    child = np.flatnonzero(parent >= 0)
    p = parent[child]
    if (e[child] > e[p]).any() or (s[child] >= e[p]).any():
        return None
    del child, p
    order = np.argsort(parent, kind="stable")  # siblings together, in order
    same = parent[order][1:] == parent[order][:-1]
    if (e[order[:-1][same]] > s[order[1:][same]]).any():
        return None
    return parent


def _stretch_parents(s: np.ndarray, e: np.ndarray) -> np.ndarray | None:
    """`nested_parents` of one long group, a stretch of `PIECE` intervals at a time: a stretch is solved after
    the intervals still open at its first start (the stack there, which is the last interval's chain of
    enclosing intervals less those that ended), so its temporaries are a stretch's, not the group's."""
    n = len(s)
    parent = np.full(n, -1, dtype=np.int64)
    for lo in range(0, n, PIECE):
        hi = min(lo + PIECE, n)
        chain: list[int] = []
        if lo:
            at = lo - 1
            while at >= 0 and len(chain) <= _DEEPEST:
                chain.append(at)
                at = int(parent[at])
            if len(chain) > _DEEPEST:  # deeper than a stretch is worth: the group at once
                return nested_parents(s, e)
            chain.reverse()  # outermost first, as the stack holds them
            opened = np.asarray(chain, dtype=np.int64)
            chain = opened[e[opened] > s[lo]].tolist()
        if chain:
            held = np.asarray(chain, dtype=np.int64)
            found = nested_parents(np.concatenate((s[held], s[lo:hi])), np.concatenate((e[held], e[lo:hi])))
            if found is None:
                return None
            found = found[len(held) :]
            in_stretch = found >= len(held)
            held_at = np.flatnonzero((found >= 0) & ~in_stretch)
            found[in_stretch] += lo - len(held)
            found[held_at] = held[found[held_at]]
        else:
            found = nested_parents(s[lo:hi], e[lo:hi])
            if found is None:
                return None
            found = np.where(found >= 0, found + lo, -1)
        parent[lo:hi] = found
    return parent


def parents_loop(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The parents (int64) of one thread's intervals by one pass with a stack of the open intervals (the
    reference)."""
    parent = [-1] * len(start)
    stack: list[int] = []
    ends = end.tolist()
    for k, s in enumerate(start.tolist()):
        while stack and ends[stack[-1]] <= s:
            stack.pop()
        if stack:
            parent[k] = stack[-1]
        stack.append(k)
    return np.array(parent, dtype=np.int64)
