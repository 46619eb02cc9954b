"""The CPU side of a rank's window, as findings need it: where the step's time goes by phase, which ops run during
given stretches of time (the GPU waiting on the host, say), and the time the host runs no torch op at all.

All times are integer ns on the rank's clock; every measure is a union of intervals (iv), so nested spans never
count twice.
"""

from __future__ import annotations

import msgspec
import numpy as np

from stepscope.analysis import intervals as iv
from stepscope.analysis.codes import unique_inverse
from stepscope.analysis.per_rank.comm_names import cpu_collective
from stepscope.analysis.per_rank.steps import (
    AUTOGRAD_RE,
    BACKWARD_RE,
    DATALOADER_RE,
    PHASES,
    STEP_RE,
    assign_phases,
    region_union,
)
from stepscope.analysis.per_rank.summary import op_tree, self_times
from stepscope.analysis.read.table import TraceTable, constant_value

PHASE_LABELS = {
    "data_loader": "data loading",
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer",
    "communication": "communication (outside the phases)",
    "other": "other code (outside the annotated phases)",
}
_X = ord("X")
_BATCH = 1 << 18  # ops per batch where a pass over all of them makes n-long temporaries


def phase_unions(table: TraceTable, lo: int, hi: int) -> dict[str, iv.Intervals]:
    """Each phase as disjoint intervals inside [lo, hi) (empty when the trace never shows it): the assignment
    of steps.assign_phases, which the per-step table uses too, so the phases never add up to more than the
    time they are measured in."""
    found = assign_phases(table)
    empty = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    return {phase: iv.clip(found[phase], lo, hi) if phase in found else empty for phase in PHASES}


def annotated_phases(table: TraceTable) -> frozenset[str]:
    """The phases the trace shows at all (annotated, or the optimizer's closure): one it never shows has an
    unknown time, not 0."""
    return frozenset(assign_phases(table))


def phase_times(phases: dict[str, iv.Intervals], within: iv.Intervals) -> dict[str, int]:
    """Time of each phase inside `within` (disjoint intervals), plus "other": the rest of `within`."""
    out = {p: iv.length(iv.intersect(u, within)) for p, u in phases.items()}
    out["other"] = max(iv.length(within) - sum(out.values()), 0)
    return out


class OpTime(msgspec.Struct):
    """An op name and the time it accounts for inside some stretches of the window."""

    name: str
    ns: int  # self time inside the stretches
    calls: int  # calls overlapping them
    mean_call_ns: float  # mean duration of those calls (inclusive)


def ops_during(table: TraceTable, within: iv.Intervals, top: int = 3) -> list[OpTime]:
    """The `top` cpu_op names by self time spent inside `within`. An op's self time inside the stretches is
    taken as its share of self time in its whole span (self / duration) times the part of its span inside them."""
    rows, self_ns = _cpu_op_self(table)
    if len(rows) == 0 or len(within[0]) == 0:
        return []
    ts, durations, codes = table.columns["ts"], table.columns["dur"], table.columns["name"]
    # a batch of ops at a time: the temporaries of a big trace's ops would be hundreds of MB
    found: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (name, inside, dur) of the ops inside
    for at in range(0, len(rows), _BATCH):
        batch = rows[at : at + _BATCH]
        start, dur = ts[batch], durations[batch]
        covered = iv.covered_within(within, start, start + dur)
        hit = covered > 0
        if hit.any():
            share = np.where(dur > 0, self_ns[at : at + _BATCH] / np.maximum(dur, 1), 0.0)
            found.append((codes[batch][hit], (covered * share)[hit], dur[hit]))
    if not found:
        return []
    names, inside, dur = (np.concatenate(column) for column in zip(*found, strict=True))
    del found
    uniq, inverse = unique_inverse(names)
    total = np.bincount(inverse, weights=inside)
    calls = np.bincount(inverse)
    durs = np.bincount(inverse, weights=dur)
    order = np.argsort(-total, kind="stable")[:top]
    return [
        OpTime(table.names[int(uniq[i])], int(total[i]), int(calls[i]), float(durs[i] / calls[i]))
        for i in order
        if total[i] > 0
    ]


def op_rows_outside_python(table: TraceTable) -> np.ndarray:
    """Rows of complete cpu_op / user_annotation events other than ProfilerStep spans."""
    rows = table.complete_rows("cpu_op", "user_annotation")
    if len(rows) == 0:
        return rows
    steps = table.names_matching(lambda n: STEP_RE.match(n) is not None, key="profiler_step_any")
    return rows[~steps[table.columns["name"][rows]]]


def untraced_time(table: TraceTable, lo: int, hi: int) -> iv.Intervals:
    """The parts of [lo, hi) during which the threads of the rank's steps run no cpu_op and are not loading data:
    Python code, sleeps and I/O the profiler does not see as ops. Time inside the backward pass (autograd may run
    it on threads of its own while the step's thread waits) and inside collectives of any thread (the step's
    thread may wait for them) is left out."""
    # (on a big trace each array of rows or times is tens of MB: each goes as soon as it is used)
    rows = op_rows_outside_python(table)
    is_coll = table.name_values(lambda n: cpu_collective(n) is not None, bool, key="cpu_collective")
    coll = rows[is_coll[table.columns["name"][rows]]] if len(rows) else rows
    ops = rows[table.columns["cat"][rows] == table.cat_id("cpu_op")] if len(rows) else rows
    del rows
    step_threads = _step_threads(table)
    if len(ops) and len(step_threads):
        ops = ops[_on_threads(table.columns["tid"], ops, step_threads)]
    busy = _union_of(table, ops)
    del ops
    for extra in (
        region_union(table, DATALOADER_RE),
        region_union(table, BACKWARD_RE) or region_union(table, AUTOGRAD_RE),
        _union_of(table, coll),
    ):
        if extra is not None and len(extra[0]):  # (each union of a big trace's ops is tens of MB)
            busy = iv.merge(np.r_[busy[0], extra[0]], np.r_[busy[1], extra[1]])
    return iv.complement(busy, lo, hi, owned=True)


def _on_threads(tid: np.ndarray, rows: np.ndarray, threads: np.ndarray) -> np.ndarray:
    """Which of `rows` are events of one of `threads` (a table of one thread: no tid is gathered)."""
    one = constant_value(tid)
    if one is not None:
        return np.full(len(rows), one in threads.tolist(), dtype=bool)
    return np.isin(tid[rows], threads)


def _union_of(table: TraceTable, rows: np.ndarray) -> iv.Intervals:
    """The union of the spans of some complete events."""
    start = table.columns["ts"][rows]
    end = table.columns["dur"][rows]
    end += start
    return iv.merge(start, end, owned=True)


def regions_during(table: TraceTable, within: iv.Intervals, top: int = 1) -> list[tuple[str, int]]:
    """User-annotated regions (not ProfilerStep, not phases of PHASES) holding most of `within`: (name, ns)."""
    rows = op_rows_outside_python(table)
    ann = table.cat_id("user_annotation")
    rows = rows[table.columns["cat"][rows] == ann] if len(rows) else rows
    step_threads = _step_threads(table)
    if len(rows) and len(step_threads):
        rows = rows[np.isin(table.columns["tid"][rows], step_threads)]
    if len(rows) == 0 or len(within[0]) == 0:
        return []
    start = table.columns["ts"][rows]
    covered = iv.covered_within(within, start, start + table.columns["dur"][rows])
    names = table.columns["name"][rows]
    totals: dict[str, int] = {}
    for code, ns in zip(names[covered > 0].tolist(), covered[covered > 0].tolist(), strict=True):
        name = table.names[code]
        if not DATALOADER_RE.search(name):
            totals[name] = totals.get(name, 0) + int(ns)
    return sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))[:top]


def small_top_level_ops(table: TraceTable, lo: int, hi: int, max_ns: int) -> tuple[int, int, iv.Intervals]:
    """Top-level cpu_ops (no enclosing cpu_op on their thread) starting in [lo, hi): (how many, how many are
    shorter than `max_ns`, the time they take). That time is the union of the short ops and of the gaps shorter
    than `max_ns` between consecutive short ops of a thread: the Python that issues them one after another."""
    tree = op_tree(table, ("cpu_op",))
    empty = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    if len(tree.rows) == 0:
        return 0, 0, empty
    # (on a big trace every n-long array is tens of MB: they are filtered by masks, reused, dropped early)
    top = tree.parent < 0
    rows = tree.rows[top]
    thread = np.cumsum(
        tree.new_thread(table.columns), dtype=np.int32 if len(tree.rows) < 2**31 else np.int64
    )[top]
    del top
    start = table.columns["ts"][rows]
    inside = start >= lo
    inside &= start < hi
    if not inside.all():
        rows, start, thread = rows[inside], start[inside], thread[inside]
    del inside
    count = len(rows)
    end = table.columns["dur"][rows]
    del rows
    small = end < max_ns
    if not small.all():
        start, end, thread = start[small], end[small], thread[small]
    del small
    end += start
    if len(start) > 1:
        # a short gap to the next short op of the same thread belongs to the run of small ops
        joined = thread[1:] == thread[:-1]
        gap = start[1:] - end[:-1]
        joined &= gap >= 0
        joined &= gap < max_ns
        del gap
        end[:-1][joined] = start[1:][joined]
    del thread
    n_small = len(start)
    return count, n_small, iv.clip(iv.merge(start, end, owned=True), lo, hi, owned=True)


def _cpu_op_self(table: TraceTable) -> tuple[np.ndarray, np.ndarray]:
    """Rows of cpu_op events and their self time among cpu_ops alone (runtime calls count as the op's own)."""
    rows = table.complete_rows("cpu_op")
    return rows, self_times(table, ("cpu_op",))[rows]


def _step_threads(table: TraceTable) -> np.ndarray:
    steps = table.names_matching(lambda n: STEP_RE.match(n) is not None, key="profiler_step_any")
    rows = np.flatnonzero(steps[table.columns["name"]] & (table.columns["ph"] == _X))
    return unique_inverse(table.columns["tid"][rows])[0]


__all__ = [
    "PHASES",
    "PHASE_LABELS",
    "OpTime",
    "annotated_phases",
    "ops_during",
    "phase_times",
    "phase_unions",
    "regions_during",
    "small_top_level_ops",
    "untraced_time",
]
