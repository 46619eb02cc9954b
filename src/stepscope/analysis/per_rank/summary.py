"""Top CPU ops by self time and top GPU kernels by total time, per rank (pure compute, no printing).

Self time of a host event = its duration minus the time of its direct children: the events of the
`CPU_OP_CATEGORIES` on the same (rank, pid, tid) that start inside it. A child sticking out past its
parent's end counts only up to that end, and self time is never negative. `python_function` events
(with_stack traces) are left out of both sides, so an op's self time is what PyTorch's profiler calls
"self CPU time". `ProfilerStep#N` rows are grouped as `ProfilerStep#*`.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
import numpy as np

from stepscope.analysis.codes import unique_inverse
from stepscope.analysis.per_rank._nesting import tree_parents
from stepscope.analysis.read.derived import THREAD_KEYS, OpTree, is_constant, new_thread_mask
from stepscope.analysis.read.table import TraceTable

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
    spans = _rank_spans(table)
    categories = {c: table.cat_mask(c) for c in (KERNEL_CATEGORY, "gpu_memcpy", "gpu_memset")}
    for rank in table.rank_ids():
        span = spans.get(rank) if spans is not None else None
        if spans is not None and span is None:
            span = slice(0, 0)  # (a rank named in the header without a row)
        rows: Any = span if span is not None else table.columns["rank"] == rank
        ops = op_stats(table, self_ns, rank, groups=groups, span=span)
        kernels = kernel_stats(table, rank, span=span)
        dur = table.columns["dur"][rows]
        info = table.ranks.get(rank)
        ranks.append(
            RankSummary(
                rank=rank,
                source=info.source if info else "",
                cpu_self_us=_us(int(self_ns[rows].sum())),
                kernel_us=_us(int(dur[categories[KERNEL_CATEGORY][rows]].sum())),
                memcpy_us=_us(int(dur[categories["gpu_memcpy"][rows]].sum())),
                memset_us=_us(int(dur[categories["gpu_memset"][rows]].sum())),
                ops=ops[:top] if top > 0 else ops,
                kernels=kernels[:top] if top > 0 else kernels,
            )
        )
    return Summary(schema=SUMMARY_SCHEMA, top=top, ranks=ranks, notices=list(table.notices))


def _rank_spans(table: TraceTable) -> dict[int, slice] | None:
    """Each rank's rows as one slice, where the table holds its ranks one after the other (a folder's ranks
    are loaded so): each rank's figures then read its own rows, not the whole table once per rank (quadratic
    in ranks). None when the ranks' rows interleave."""
    rank = np.asarray(table.columns["rank"])
    if len(rank) > 1 and (rank[1:] < rank[:-1]).any():
        return None
    ids = np.unique(rank) if len(rank) else np.zeros(0, dtype=np.int64)
    starts = np.searchsorted(rank, ids, side="left")
    ends = np.searchsorted(rank, ids, side="right")
    return {int(r): slice(int(a), int(b)) for r, a, b in zip(ids, starts, ends, strict=True)}


def self_times(table: TraceTable, categories: tuple[str, ...] = CPU_OP_CATEGORIES) -> np.ndarray:
    """Self time in ns of every row (0 for rows that are not complete events of `categories`); children are
    the events of `categories` nested on the same thread. Computed once per table and categories (the result
    is shared: do not modify it)."""
    cached = table.derived.self_times.get(categories)
    if cached is not None and len(cached) == len(table):
        return cached
    out = _self_times(table, categories)
    out.flags.writeable = False
    table.derived.self_times[categories] = out
    return out


_BATCH = 1 << 18  # events per batch where a pass over all of them would make n-long temporaries


def op_tree(table: TraceTable, categories: tuple[str, ...]) -> OpTree:
    """The `OpTree` of the events of `categories` (computed once per table and categories; do not modify)."""
    trees = table.derived.op_trees
    cached = trees.get(categories)
    if cached is not None:
        return cached
    for other, bigger in list(trees.items()):
        if bigger.nested and set(categories) < set(other):
            trees[categories] = tree = _sub_tree(table, bigger, categories)
            return tree
    # (on a big trace every array here is tens of MB: each goes as soon as it is used, indices are int32)
    index = np.int32 if len(table) < 2**31 else np.int64
    rows = table.complete_rows(*categories).astype(index, copy=False)
    start = table.columns["ts"][rows]
    end = table.columns["dur"][rows]
    end += start
    keys = [  # (a column constant over the whole table is left out before it is gathered)
        key
        for key in (table.columns[k][rows] for k in THREAD_KEYS if not is_constant(table.columns[k]))
        if len(key) and key.min() != key.max()
    ]
    if keys or not _in_thread_order(start, end):
        order = thread_order(keys, start, end)
        new_thread = new_thread_mask([k[order] for k in keys], len(rows))
        rows = rows[order]
        start = start[order]
        end = end[order]
        del order
    else:  # one thread, its events in order already (tiny-event traces are): no copies
        new_thread = new_thread_mask([], len(rows))
    del keys
    parent, nested = tree_parents(start, end, new_thread, index)
    tree = OpTree(rows, parent, nested)
    tree.rows.flags.writeable = tree.parent.flags.writeable = False
    trees[categories] = tree
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
    for categories in category_sets:
        op_tree(table, categories)
    table.derived.keep_only_op_trees(*category_sets)


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


def _in_thread_order(start: np.ndarray, end: np.ndarray) -> bool:
    """Whether events are in `thread_order`'s order already (one thread): by start, longest first."""
    for at in range(0, len(start), _BATCH):
        s, e = start[at : at + _BATCH + 1], end[at : at + _BATCH + 1]
        if not ((s[1:] > s[:-1]) | ((s[1:] == s[:-1]) & (e[1:] <= e[:-1]))).all():
            return False
    return True


def _self_times(table: TraceTable, categories: tuple[str, ...]) -> np.ndarray:
    out = np.zeros(len(table), dtype=np.int64)
    tree = op_tree(table, categories)
    ts, dur = table.columns["ts"], table.columns["dur"]
    # a batch of the tree's events at a time (on a big trace each n-long temporary is tens of MB): the time of
    # each child inside its parent is taken from the parent's row (np.add.at: exact int64 sums)
    for at in range(0, len(tree.rows), _BATCH):
        parent = tree.parent[at : at + _BATCH]
        child = np.flatnonzero(parent >= 0)
        if not len(child):
            continue
        child_rows = tree.rows[at : at + _BATCH][child]
        parent_rows = tree.rows[parent[child]]
        child_start = ts[child_rows]
        inside = np.minimum(child_start + dur[child_rows], ts[parent_rows] + dur[parent_rows]) - child_start
        np.subtract.at(out, parent_rows, inside)
    for at in range(0, len(tree.rows), _BATCH):
        rows = tree.rows[at : at + _BATCH]
        out[rows] = np.maximum(out[rows] + dur[rows], 0)
    return out


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
    span: slice | None = None,
) -> list[OpStat]:
    """Every op name with its calls and times (one rank, or all ranks pooled), by self time, descending.

    `self_ns` comes from `self_times(table)`; `groups` from `_group_codes(table)` when calling per rank;
    `span`: the rows of `rank`, where they are one run (summarize's _rank_spans)."""
    codes, group_names = groups or _group_codes(table)
    count = np.zeros(len(group_names), dtype=np.int64)
    self_sum = np.zeros(len(group_names), dtype=np.int64)
    dur_sum = np.zeros(len(group_names), dtype=np.int64)
    is_op = _category_lookup(table, CPU_OP_CATEGORIES)
    ph, cat, name, dur = (table.columns[k] for k in ("ph", "cat", "name", "dur"))
    # a batch of rows at a time: on a big trace the selected rows' codes and times would be n-long arrays
    lo, hi = (span.start, span.stop) if span is not None else (0, len(table))
    for at in range(lo, hi, _BATCH):
        part = slice(at, min(at + _BATCH, hi))
        mask = is_op[cat[part]]
        mask &= ph[part] == ord("X")
        if rank is not None and span is None:
            mask &= table.columns["rank"][part] == rank
        keys = codes[name[part][mask]]
        np.add.at(count, keys, 1)
        np.add.at(self_sum, keys, self_ns[part][mask])
        np.add.at(dur_sum, keys, dur[part][mask])
    uniq = np.flatnonzero(count)
    count, self_sum, dur_sum = count[uniq], self_sum[uniq], dur_sum[uniq]
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


def kernel_stats(
    table: TraceTable, rank: int | None = None, *, span: slice | None = None
) -> list[KernelStat]:
    """Every kernel name with its launches and total time, by total time, descending (`span`: as op_stats)."""
    rows = span if span is not None else slice(None)
    mask = (table.columns["ph"][rows] == ord("X")) & _category_lookup(table, (KERNEL_CATEGORY,))[
        table.columns["cat"][rows]
    ]
    if rank is not None and span is None:
        mask &= table.columns["rank"] == rank
    uniq, inverse = unique_inverse(table.columns["name"][rows][mask])
    count = np.bincount(inverse, minlength=len(uniq))
    total = _int_sums(inverse, table.columns["dur"][rows][mask], len(uniq))
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


def _category_lookup(table: TraceTable, categories: tuple[str, ...]) -> np.ndarray:
    """By category code (the last entry: -1, none): whether it is one of `categories`."""
    lookup = np.zeros(len(table.cats) + 1, dtype=bool)
    lookup[[i for i in (table.cat_id(c) for c in categories) if i >= 0]] = True
    return lookup


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
