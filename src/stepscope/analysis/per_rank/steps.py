"""Profiler steps: find the steps of a rank (ProfilerStep#N spans, each beginning where the one before it ends),
assign every instant to one phase (data loading, forward, backward, optimizer; the optimizer's closure is
forward and backward), build the per-step table. docs/analysis.md ("What a step is", "Phases") says why.
"""

from __future__ import annotations

import re

import msgspec
import numpy as np

from stepscope.analysis import intervals as iv
from stepscope.analysis.codes import unique_inverse
from stepscope.analysis.read.table import MISSING, TraceTable

STEP_RE = re.compile(r"^ProfilerStep\s*#\s*(\d+)$")
# CPU regions. Names are matched in the cpu_op and user_annotation categories (record_function lands in either),
# never in python_function (with_stack frames such as "linear.py(124): forward" are not regions).
DATALOADER_RE = re.compile(r"DataLoader")
FORWARD_RE = re.compile(r"(?<![A-Za-z0-9_])forward(?![A-Za-z0-9_])", re.IGNORECASE)
BACKWARD_RE = re.compile(r"(?<![A-Za-z0-9_])backward(?![A-Za-z0-9_])", re.IGNORECASE)
OPTIMIZER_RE = re.compile(r"(?<![A-Za-z0-9_])optimizer(?![A-Za-z0-9_])", re.IGNORECASE)
# Without a backward annotation, the autograd engine's per-node spans stand in for the backward pass.
AUTOGRAD_RE = re.compile(r"^autograd::engine::evaluate_function")
REGION_CATEGORIES = ("cpu_op", "user_annotation")
# The phases of a training step, in the order they run; "other" is the rest of the step.
PHASES = ("data_loader", "forward", "backward", "optimizer")

_X = ord("X")
_EMPTY: iv.Intervals = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))


# Records of arrays: compared and printed by identity (a field-wise == of arrays raises, and their repr
# would print the arrays); generating __eq__ and __repr__ cost ~0.15 ms of every start.
class StepSpans(msgspec.Struct, eq=False):
    """ProfilerStep spans of one rank, sorted by start; times in ns."""

    number: np.ndarray
    start: np.ndarray
    end: np.ndarray

    def __len__(self) -> int:
        return len(self.number)

    def head(self, n: int) -> StepSpans:
        return StepSpans(self.number[:n], self.start[:n], self.end[:n])


class StepRow(msgspec.Struct):
    """One profiler step of one rank. Region times are null when the trace never annotates that region."""

    step: int
    start_us: float  # from the start of the rank's first step
    dur_us: float
    gpu_busy_pct: float | None  # union of GPU activity inside the step's wall time / step time
    comm_us: float | None  # union of communication kernels inside the step's wall time
    kernels: int  # GPU activities launched during the step
    dataloader_us: float | None
    forward_us: float | None
    backward_us: float | None
    optimizer_us: float | None


def _is_step_name(name: str) -> bool:
    """ProfilerStep#N with N an int64 (a larger N is not a step number torch writes: the span is left alone)."""
    m = STEP_RE.match(name)
    return m is not None and int(m.group(1)) < 1 << 62


def find_steps(table: TraceTable) -> StepSpans:
    """ProfilerStep#N spans on the CPU side (GPU-side copies are ignored); one span per step number."""
    step_names = table.names_matching(_is_step_name, key="profiler_step")
    if not step_names.any():
        return StepSpans(*(np.zeros(0, dtype=np.int64) for _ in range(3)))
    cpu_cats = [table.cat_id(c) for c in ("gpu_user_annotation", "kernel", "gpu_memcpy", "gpu_memset")]
    rows = np.flatnonzero(
        step_names[table.columns["name"]]
        & (table.columns["ph"] == _X)
        & ~np.isin(table.columns["cat"], [c for c in cpu_cats if c != MISSING])
    )
    numbers = np.fromiter(
        (int(STEP_RE.match(table.names[i]).group(1)) for i in table.columns["name"][rows]),  # type: ignore[union-attr]
        dtype=np.int64,
        count=len(rows),
    )
    start = table.columns["ts"][rows]
    end = start + table.columns["dur"][rows]
    uniq, inverse = unique_inverse(numbers)
    first = np.full(len(uniq), np.iinfo(np.int64).max)
    last = np.full(len(uniq), np.iinfo(np.int64).min)
    np.minimum.at(first, inverse, start)
    np.maximum.at(last, inverse, end)
    order = np.argsort(first, kind="stable")
    return _contiguous(StepSpans(uniq[order], first[order], last[order]))


def _contiguous(steps: StepSpans) -> StepSpans:
    """A step begins where the step before it (the one numbered one less) ends. Time between two ProfilerStep
    spans (traces that mark a step around a call only: the next batch is fetched between them) belongs to the
    step after it, as in the spans of a loop that marks each step's end, where a step fetches its own batch."""
    start = steps.start.copy()
    follows = (steps.number[1:] == steps.number[:-1] + 1) & (steps.end[:-1] < start[1:])
    start[1:][follows] = steps.end[:-1][follows]
    return StepSpans(steps.number, start, steps.end)


def region_union(table: TraceTable, pattern: re.Pattern[str]) -> iv.Intervals | None:
    """Union of the CPU spans whose names match `pattern` (cpu_op / user_annotation); None when there are none.
    Kept in the table's row cache: the step table, the step breakdown and the findings each ask for the phases."""
    spans = region_spans(table, pattern)
    unions = table.derived.region_unions
    if pattern not in unions:
        unions[pattern] = _read_only(None if spans is None else iv.merge(*spans))
    return unions[pattern]


def region_spans(table: TraceTable, pattern: re.Pattern[str]) -> iv.Intervals | None:
    """The CPU spans whose names match `pattern`, one per event (unmerged, in the table's order); None when
    there are none."""
    spans = table.derived.region_spans
    if pattern not in spans:
        spans[pattern] = _read_only(_region_spans(table, pattern))
    return spans[pattern]


def _read_only(found: iv.Intervals | None) -> iv.Intervals | None:
    for column in found or ():
        column.flags.writeable = False  # (shared by every caller)
    return found


def _region_spans(table: TraceTable, pattern: re.Pattern[str]) -> iv.Intervals | None:
    spans = table.complete_rows(*REGION_CATEGORIES)
    if len(spans) == 0:
        return None
    name = table.columns["name"][spans]
    names = table.names_matching(
        lambda n: pattern.search(n) is not None and STEP_RE.match(n) is None,
        key=("region", pattern),
        among=name,
    )
    rows = spans[names[name]]
    if len(rows) == 0:
        return None
    start = table.columns["ts"][rows]
    return start, start + table.columns["dur"][rows]


def assign_phases(table: TraceTable) -> dict[str, iv.Intervals]:
    """Each phase of PHASES as disjoint intervals over the whole rank: every instant belongs to one phase at
    most. Absent from the result: a phase the trace never shows (no annotation, no optimizer closure).

    An annotated phase is its spans; the backward falls back to the autograd engine's spans. The optimizer's
    closure (`optimizer.step(closure)`, what Lightning runs) is forward and backward: inside an optimizer span,
    the time from its start to the end of the last backward inside it goes to the backward where the backward
    runs, to the optimizer where an optimizer span nested in it runs (zero_grad), and to the forward otherwise.
    Where annotations nest or overlap, the first phase of PHASES wins."""
    if table.derived.phases is None:
        table.derived.phases = _assign_phases(table)
    return table.derived.phases


def _assign_phases(table: TraceTable) -> dict[str, iv.Intervals]:
    loader = region_union(table, DATALOADER_RE)
    forward = region_union(table, FORWARD_RE)
    backward = region_union(table, BACKWARD_RE) or region_union(table, AUTOGRAD_RE)
    optimizer = region_spans(table, OPTIMIZER_RE)
    closure = nested = None
    if optimizer is not None:
        outer, inner = _outermost(optimizer)
        closure = _closures(outer, backward) if backward is not None else None
        if closure is not None and len(inner[0]):
            nested = iv.intersect(iv.merge(*inner), closure)
    # in order of precedence: a phase never counts time a phase before it has
    sources: list[tuple[str, iv.Intervals | None]] = [
        ("data_loader", loader),
        ("forward", forward),
        ("backward", backward),
        ("optimizer", nested),
        ("forward", closure),
        ("optimizer", None if optimizer is None else iv.merge(*optimizer)),
    ]
    out: dict[str, iv.Intervals] = {}
    taken = _EMPTY
    for phase, union in sources:
        if union is None:
            continue
        own = iv.subtract(union, taken)
        out[phase] = _union(out[phase], own) if phase in out else own
        taken = _union(taken, own)
    return {phase: out[phase] for phase in PHASES if phase in out}


def _outermost(spans: iv.Intervals) -> tuple[iv.Intervals, iv.Intervals]:
    """(the spans no other span contains, the others)."""
    start, end = spans
    order = np.lexsort((-end, start))  # by start, the longest first
    start, end = start[order], end[order]
    reach = np.maximum.accumulate(end)
    inside = np.zeros(len(start), dtype=bool)
    inside[1:] = end[1:] <= reach[:-1]
    return (start[~inside], end[~inside]), (start[inside], end[inside])


def _closures(outer: iv.Intervals, backward: iv.Intervals) -> iv.Intervals | None:
    """Of each outermost optimizer span, the stretch from its start to the end of the last backward that runs
    inside it: the closure the optimizer calls (forward, zero_grad, backward). None when no span has one."""
    start, end = outer
    b_start, b_end = backward
    last = np.searchsorted(b_start, end, side="left") - 1  # the last backward starting before the span ends
    has = last >= 0
    closure_end = np.where(has, np.minimum(b_end[np.maximum(last, 0)], end), start)
    has &= closure_end > start
    if not has.any():
        return None
    return iv.merge(start[has], closure_end[has])


def _union(a: iv.Intervals, b: iv.Intervals) -> iv.Intervals:
    return iv.merge(np.r_[a[0], b[0]], np.r_[a[1], b[1]])


def step_table(
    table: TraceTable,
    steps: StepSpans,
    gpu_busy: iv.Intervals | None,
    comm: iv.Intervals | None,
    launches: np.ndarray,
) -> list[StepRow]:
    """The per-step table of one rank. `gpu_busy`/`comm`: unions over the whole rank; `launches`: GPU launch times."""
    if len(steps) == 0:
        return []
    lo, hi = steps.start, steps.end
    dur = hi - lo
    phases = assign_phases(table)
    measured = {p: (iv.covered_within(phases[p], lo, hi) if p in phases else None) for p in PHASES}
    busy = None if gpu_busy is None else iv.covered_within(gpu_busy, lo, hi)
    comm_t = None if comm is None else iv.covered_within(comm, lo, hi)
    ordered = np.sort(launches)
    launched = np.searchsorted(ordered, hi) - np.searchsorted(ordered, lo)

    def us(values: np.ndarray | None, i: int) -> float | None:
        return None if values is None else ns_to_us(int(values[i]))

    return [
        StepRow(
            step=int(steps.number[i]),
            start_us=ns_to_us(int(lo[i] - lo[0])),
            dur_us=ns_to_us(int(dur[i])),
            gpu_busy_pct=None if busy is None else pct(int(busy[i]), int(dur[i])),
            comm_us=us(comm_t, i),
            kernels=int(launched[i]),
            dataloader_us=us(measured["data_loader"], i),
            forward_us=us(measured["forward"], i),
            backward_us=us(measured["backward"], i),
            optimizer_us=us(measured["optimizer"], i),
        )
        for i in range(len(steps))
    ]


def ns_to_us(ns: int | float) -> float:
    """Integer ns -> us, rounded to the ns."""
    return round(ns / 1000.0, 3)


def pct(part: int | float, whole: int | float) -> float | None:
    """Percentage rounded to 0.001; None when the whole is empty."""
    return None if whole <= 0 else round(100.0 * part / whole, 3)
