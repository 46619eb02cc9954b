"""Profiler steps: find the ProfilerStep#N spans of a rank, choose the analysis window, build the per-step table.

The per-step table measures CPU-side regions (data loading, forward, backward, optimizer) as unions of the
annotated spans inside each step, so nested annotations are not counted twice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import msgspec
import numpy as np

from stepscope.analysis import _intervals as iv
from stepscope.analysis._codes import unique_inverse
from stepscope.analysis.table import MISSING, TraceTable

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

_X = ord("X")


@dataclass
class StepSpans:
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
    return StepSpans(uniq[order], first[order], last[order])


def region_union(table: TraceTable, pattern: re.Pattern[str]) -> iv.Intervals | None:
    """Union of the CPU spans whose names match `pattern` (cpu_op / user_annotation); None when there are none.
    Kept in the table's row cache: the step table, the step breakdown and the findings each ask for the phases."""
    key = ("region_union", pattern)
    if key not in table.row_cache:
        union = table.row_cache[key] = _region_union(table, pattern)
        for column in union or ():
            column.flags.writeable = False  # (shared by every caller)
    return table.row_cache[key]  # type: ignore[no-any-return]


def _region_union(table: TraceTable, pattern: re.Pattern[str]) -> iv.Intervals | None:
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
    return iv.merge(start, start + table.columns["dur"][rows])


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
    regions = {
        "dataloader": region_union(table, DATALOADER_RE),
        "forward": region_union(table, FORWARD_RE),
        "backward": region_union(table, BACKWARD_RE) or region_union(table, AUTOGRAD_RE),
        "optimizer": region_union(table, OPTIMIZER_RE),
    }
    measured = {k: (None if u is None else iv.covered_within(u, lo, hi)) for k, u in regions.items()}
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
            dataloader_us=us(measured["dataloader"], i),
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
