"""Top CPU ops by self time and top GPU kernels by total time, per rank (pure compute, no printing).

Self time of a host event = its duration minus the time of its direct children: the events of the
`CPU_OP_CATEGORIES` on the same (rank, pid, tid) that start inside it. A child sticking out past its
parent's end counts only up to that end, and self time is never negative. `python_function` events
(with_stack traces) are left out of both sides, so an op's self time is what PyTorch's profiler calls
"self CPU time". `ProfilerStep#N` rows are grouped as `ProfilerStep#*`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import msgspec
import numpy as np

from stepscope.analysis._codes import unique_inverse
from stepscope.analysis.table import TraceTable

SUMMARY_SCHEMA = "stepscope.summary/1"

# Host-side events that nest on a thread and are listed as "CPU ops" (2021 names are mapped already).
CPU_OP_CATEGORIES = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")
KERNEL_CATEGORY = "kernel"
_STEP_NAME = re.compile(r"ProfilerStep#\d+")


class OpStat(msgspec.Struct):
    """A host op (all calls of one name on a rank, or over all ranks in a diff)."""

    name: str
    count: int
    self_us: float  # sum of self times
    total_us: float  # sum of durations (inclusive of children; recursion counts twice)
    mean_self_us: float
    self_pct: float  # share of the self time of all listed ops


class KernelStat(msgspec.Struct):
    """All launches of one GPU kernel name."""

    name: str
    count: int
    total_us: float
    mean_us: float
    pct: float  # share of all kernel time


class RankSummary(msgspec.Struct):
    rank: int
    source: str
    cpu_self_us: float  # self time of all listed ops (= host time covered by them)
    kernel_us: float  # sum of kernel durations (not their union)
    memcpy_us: float
    memset_us: float
    ops: list[OpStat]
    kernels: list[KernelStat]


class Summary(msgspec.Struct):
    schema: str
    top: int
    ranks: list[RankSummary]
    notices: list[str]


def summarize(table: TraceTable, top: int = 10) -> Summary:
    """Per rank: the `top` ops by self time and kernels by total time (top <= 0: all of them)."""
    self_ns = self_times(table)
    groups = _group_codes(table)
    ranks = []
    for rank in table.rank_ids():
        ops = op_stats(table, self_ns, rank, groups=groups)
        kernels = kernel_stats(table, rank)
        in_rank = table.rank == rank
        info = table.ranks.get(rank)
        ranks.append(
            RankSummary(
                rank=rank,
                source=info.source if info else "",
                cpu_self_us=_us(int(self_ns[in_rank].sum())),
                kernel_us=_us(int(table.dur[in_rank & table.cat_mask(KERNEL_CATEGORY)].sum())),
                memcpy_us=_us(int(table.dur[in_rank & table.cat_mask("gpu_memcpy")].sum())),
                memset_us=_us(int(table.dur[in_rank & table.cat_mask("gpu_memset")].sum())),
                ops=ops[:top] if top > 0 else ops,
                kernels=kernels[:top] if top > 0 else kernels,
            )
        )
    return Summary(schema=SUMMARY_SCHEMA, top=top, ranks=ranks, notices=list(table.notices))


def self_times(table: TraceTable, categories: tuple[str, ...] = CPU_OP_CATEGORIES) -> np.ndarray:
    """Self time in ns of every row (0 for rows that are not complete events of `categories`); children are
    the events of `categories` nested on the same thread. Computed once per table and categories (the result
    is shared: do not modify it)."""
    cached = table.row_cache.get(("self_times", categories))
    if cached is not None and len(cached) == len(table):
        return cached  # type: ignore[no-any-return]
    out = _self_times(table, categories)
    out.flags.writeable = False
    table.row_cache[("self_times", categories)] = out
    return out


# Records of arrays: compared and printed by identity (a field-wise == of arrays raises, and their repr
# would print the arrays); generating __eq__ and __repr__ cost ~0.15 ms of every start.
@dataclass(eq=False, repr=False, frozen=True)
class OpTree:
    """The complete events of some categories in the order of `thread_order`, with each one's innermost
    enclosing event among them (what one pass with a stack of the open events gives, thread by thread)."""

    rows: np.ndarray  # table rows, in that order
    parent: np.ndarray  # position in `rows` of the enclosing event, -1 for none
    nested: bool = False  # every thread's events nest (each inside its parent, siblings apart)

    def new_thread(self, table: TraceTable) -> np.ndarray:
        """True where a thread's events begin in `rows`."""
        return _new_thread([table.columns[k][self.rows] for k in _THREAD_KEYS], len(self.rows))


_THREAD_KEYS = ("rank", "pid", "tid")


def op_tree(table: TraceTable, categories: tuple[str, ...]) -> OpTree:
    """The `OpTree` of the events of `categories` (computed once per table and categories; do not modify)."""
    key = ("op_tree", categories)
    cached = table.row_cache.get(key)
    if isinstance(cached, OpTree):
        return cached
    for other, bigger in list(table.row_cache.items()):
        if isinstance(bigger, OpTree) and bigger.nested and set(categories) < set(other[1]):
            table.row_cache[key] = tree = _sub_tree(table, bigger, categories)
            return tree
    # (on a big trace every array here is tens of MB: each goes as soon as it is used, indices are int32)
    index = np.int32 if len(table) < 2**31 else np.int64
    rows = table.complete_rows(*categories).astype(index, copy=False)
    start = table.columns["ts"][rows]
    end = start + table.columns["dur"][rows]
    keys = [
        key for key in (table.columns[k][rows] for k in _THREAD_KEYS) if len(key) and key.min() != key.max()
    ]
    order = thread_order(keys, start, end)
    new_thread = _new_thread([k[order] for k in keys], len(rows))
    del keys
    rows = rows[order]
    start = start[order]
    end = end[order]
    del order
    parent, nested = _tree_parents(start, end, new_thread)
    tree = OpTree(rows, parent.astype(index), nested)
    tree.rows.flags.writeable = tree.parent.flags.writeable = False
    table.row_cache[key] = tree
    return tree


def _sub_tree(table: TraceTable, bigger: OpTree, categories: tuple[str, ...]) -> OpTree:
    """The tree of some of the categories of a tree whose threads all nest: each event's parent is its nearest
    ancestor among them. (Where events nest, the stack's answer on a subset is that ancestor; the order of
    the subset's events is the bigger tree's, as `thread_order` sorts on the same keys.)"""
    mine = table.cat_mask(*categories)[bigger.rows]
    ancestor = bigger.parent.astype(np.int64)
    climb = np.flatnonzero(ancestor >= 0)
    climb = climb[~mine[ancestor[climb]]]
    while len(climb):  # up past the ancestors of other categories (a few levels: runtime calls, annotations)
        ancestor[climb] = bigger.parent[ancestor[climb]]
        climb = climb[ancestor[climb] >= 0]
        climb = climb[~mine[ancestor[climb]]]
    kept = np.flatnonzero(mine)
    position = np.full(len(bigger.rows), -1, dtype=np.int64)
    position[kept] = np.arange(len(kept))
    ancestor = ancestor[kept]
    parent = np.where(ancestor >= 0, position[np.maximum(ancestor, 0)], -1).astype(bigger.parent.dtype)
    tree = OpTree(bigger.rows[kept], parent, nested=True)
    tree.rows.flags.writeable = tree.parent.flags.writeable = False
    return tree


def keep_op_trees(table: TraceTable, *category_sets: tuple[str, ...]) -> None:
    """Drop what the table's row caches hold but the op trees of `category_sets` (made now, from a bigger tree
    when one nests): on a big trace the caches are a hundred MB or more."""
    kept = {("op_tree", categories): op_tree(table, categories) for categories in category_sets}
    table.row_cache.clear()
    table.row_cache.update(kept)


def thread_order(keys: list[np.ndarray], start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The order of events by thread (`keys`, most significant first), then start, then longest first:
    np.lexsort((-end, start, *reversed(keys))), but cheaper on what traces hold (events almost in order of
    start, few threads): stable sorts of the start, then of each thread key that is not constant."""
    order = np.argsort(start, kind="stable")
    s = start[order]
    tie = s[1:] == s[:-1]
    if tie.any():  # events starting together: longest first
        tied = np.zeros(len(s), dtype=bool)
        tied[1:] = tie
        tied[:-1] |= tie
        at = np.flatnonzero(tied)
        order[at] = order[at][np.lexsort((-end[order[at]], s[at]))]
    del s, tie
    for key in reversed(keys):
        if len(key) and key.min() != key.max():
            order = order[np.argsort(key[order], kind="stable")]
    return order


def _new_thread(keys: list[np.ndarray], n: int) -> np.ndarray:
    """True where a thread's events begin among `n` events grouped by thread (`keys`: the thread columns)."""
    new = np.zeros(n, dtype=bool)
    if n:
        new[0] = True
        for key in keys:
            new[1:] |= key[1:] != key[:-1]
    return new


def _self_times(table: TraceTable, categories: tuple[str, ...]) -> np.ndarray:
    out = np.zeros(len(table), dtype=np.int64)
    tree = op_tree(table, categories)
    if len(tree.rows) == 0:
        return out
    # (temporaries are dropped as soon as they are used: on a big trace each is tens of MB)
    start = table.columns["ts"][tree.rows]
    end = start + table.columns["dur"][tree.rows]
    child = np.flatnonzero(tree.parent >= 0)
    parent = tree.parent[child]
    inside = np.minimum(end[child], end[parent]) - start[child]
    del child
    # (float64 sums are exact below 2**53 ns, 104 days; np.add.at is several times slower)
    children_ns = np.bincount(parent, weights=inside, minlength=len(start)).astype(np.int64)
    del parent, inside
    end -= start
    end -= children_ns
    out[tree.rows] = np.maximum(end, 0)
    return out


def _parents(start: np.ndarray, end: np.ndarray, new_thread: np.ndarray) -> np.ndarray:
    """Index of each interval's innermost enclosing interval (-1: none), intervals sorted by thread,
    start, then longest first: what one pass with a stack of the open intervals gives (`_parents_loop`).

    Per thread, vectorized: the depth of an interval is the number of intervals still open when it starts
    (earlier ones with a duration, less those that ended by then), and its parent the last earlier interval
    one level up. That is the stack's answer when the thread's intervals nest (each inside its parent,
    siblings apart), which is checked; a thread where they do not (overlaps without nesting) is left to the
    loop."""
    return _tree_parents(start, end, new_thread)[0]


def _tree_parents(start: np.ndarray, end: np.ndarray, new_thread: np.ndarray) -> tuple[np.ndarray, bool]:
    """`_parents`, and whether every thread's intervals nest."""
    n = len(start)
    parent = np.full(n, -1, dtype=np.int64)
    nested = True
    if n == 0:
        return parent, nested
    bounds = np.append(np.flatnonzero(new_thread), n)
    if bounds[0] != 0:
        bounds = np.insert(bounds, 0, 0)
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        if b - a == 1:
            continue
        s, e = start[a:b], end[a:b]
        found = _nested_parents(s, e)
        nested = nested and found is not None
        parent[a:b] = _parents_loop(s, e) if found is None else found
        parent[a:b][parent[a:b] >= 0] += a
    return parent, nested


def _nested_parents(s: np.ndarray, e: np.ndarray) -> np.ndarray | None:
    """`_parents` of one thread's intervals when they nest; None when they do not."""
    n = len(s)
    lasting = e > s  # only an interval with a duration can hold another
    # (the sorts are stable: timsort and radix sort are quick on what is almost in order, or small ints;
    # temporaries are n long and go as soon as they are used)
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


def _parents_loop(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """`_parents` of one thread's intervals by one pass with a stack of the open intervals (the reference)."""
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


def _group_codes(table: TraceTable) -> tuple[np.ndarray, list[str]]:
    """Name code -> group code: ProfilerStep#N all become ProfilerStep#*, other names stay themselves."""
    groups: dict[str, int] = {}
    codes = np.array(
        [
            groups.setdefault("ProfilerStep#*" if _STEP_NAME.fullmatch(n) else n, len(groups))
            for n in table.names
        ],
        dtype=np.int64,
    )
    return codes, list(groups)


def op_stats(
    table: TraceTable,
    self_ns: np.ndarray,
    rank: int | None = None,
    *,
    groups: tuple[np.ndarray, list[str]] | None = None,
) -> list[OpStat]:
    """Every op name with its calls and times (one rank, or all ranks pooled), by self time, descending.

    `self_ns` comes from `self_times(table)`; `groups` from `_group_codes(table)` when calling per rank."""
    mask = (table.ph == ord("X")) & table.cat_mask(*CPU_OP_CATEGORIES)
    if rank is not None:
        mask &= table.rank == rank
    codes, group_names = groups or _group_codes(table)
    keys = codes[table.name[mask]]
    selfs = self_ns[mask]
    durs = table.dur[mask]
    uniq, inverse = unique_inverse(keys)
    count = np.bincount(inverse, minlength=len(uniq))
    self_sum = _int_sums(inverse, selfs, len(uniq))
    dur_sum = _int_sums(inverse, durs, len(uniq))
    grand = int(self_sum.sum())
    stats = [
        OpStat(
            name=group_names[int(uniq[i])],
            count=int(count[i]),
            self_us=_us(int(self_sum[i])),
            total_us=_us(int(dur_sum[i])),
            mean_self_us=_us(int(self_sum[i]) / int(count[i])),
            self_pct=_pct(int(self_sum[i]), grand),
        )
        for i in range(len(uniq))
    ]
    stats.sort(key=lambda s: (-s.self_us, -s.total_us, s.name))
    return stats


def kernel_stats(table: TraceTable, rank: int | None = None) -> list[KernelStat]:
    """Every kernel name with its launches and total time, by total time, descending."""
    mask = (table.ph == ord("X")) & table.cat_mask(KERNEL_CATEGORY)
    if rank is not None:
        mask &= table.rank == rank
    uniq, inverse = unique_inverse(table.name[mask])
    count = np.bincount(inverse, minlength=len(uniq))
    total = _int_sums(inverse, table.dur[mask], len(uniq))
    grand = int(total.sum())
    stats = [
        KernelStat(
            name=table.names[int(uniq[i])],
            count=int(count[i]),
            total_us=_us(int(total[i])),
            mean_us=_us(int(total[i]) / int(count[i])),
            pct=_pct(int(total[i]), grand),
        )
        for i in range(len(uniq))
    ]
    stats.sort(key=lambda s: (-s.total_us, s.name))
    return stats


def _int_sums(groups: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Exact int64 sums of `values` per group (bincount would go through float64)."""
    out = np.zeros(n, dtype=np.int64)
    np.add.at(out, groups, values)
    return out


def _us(ns: float) -> float:
    """ns -> us, rounded to the ns so that JSON shows exact values."""
    return round(ns / 1000.0, 3)


def _pct(part: int, whole: int) -> float:
    return round(100.0 * part / whole, 2) if whole else 0.0
