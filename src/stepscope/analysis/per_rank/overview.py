"""The step-time breakdown of TensorBoard's profiler overview, with communication as its own category: every
instant of a step goes to one category.

The categories, in the order that wins when several are active at once (TensorBoard's overview order, with
communication after the GPU's own work): kernel (a computation kernel runs), memcpy, memset, communication (a
collective runs: communication kernels and copies, or a CPU backend's collective range, such as gloo's),
runtime (the host is inside a CUDA runtime/driver call), data loader (a DataLoader range), CPU exec (any other
CPU op or annotation), other (nothing traced). The parts of a step add up to its wall time. GPU activity counts
wherever it runs inside the step's wall time, whichever step launched it. Across ranks, the communication of a
step splits into waiting for peers and transfer (`add_comm_waiting`).
"""

from __future__ import annotations

import re

import msgspec
import numpy as np

from stepscope.analysis import intervals as iv
from stepscope.analysis.per_rank.kernels import COMMUNICATION
from stepscope.analysis.per_rank.prepare import RankData
from stepscope.analysis.per_rank.steps import DATALOADER_RE, StepSpans, ns_to_us
from stepscope.analysis.read.table import MISSING, TraceTable

CATEGORIES = ("kernel", "memcpy", "memset", "communication", "runtime", "data_loader", "cpu_exec", "other")
CATEGORY_LABELS = {
    "kernel": "Kernel",
    "memcpy": "Memcpy",
    "memset": "Memset",
    "communication": "Communication",
    "runtime": "Runtime",
    "data_loader": "DataLoader",
    "cpu_exec": "CPU Exec",
    "other": "Other",
}
_RUNTIME = ("cuda_runtime", "cuda_driver")
_CPU = ("cpu_op", "user_annotation")
_X = ord("X")
_STEP = re.compile(r"^ProfilerStep\s*#\s*\d+$")


class StepCategories(msgspec.Struct):
    """One profiled step of one rank, its wall time split over CATEGORIES (microseconds). The communication
    splits into waiting for peers and transfer where the collectives were matched across ranks (else null)."""

    rank: int
    step: int
    dur_us: float
    kernel_us: float
    memcpy_us: float
    memset_us: float
    communication_us: float
    runtime_us: float
    data_loader_us: float
    cpu_exec_us: float
    other_us: float
    comm_wait_us: float | None = None  # of communication_us
    comm_transfer_us: float | None = None  # communication_us - comm_wait_us


def step_categories(data: RankData, comm: iv.Intervals | None) -> list[StepCategories]:
    """The overview breakdown of every step of the rank's window (empty without ProfilerStep spans). `comm`:
    the rank's time in communication, a union (collectives.communication_intervals)."""
    steps = data.steps
    if len(steps) == 0:
        return []
    table = data.table
    gpu = data.gpu_all
    own_work = gpu.kind != COMMUNICATION  # communication kernels and copies are communication
    kernel_cat = table.cat_id("kernel")
    memcpy_cat = table.cat_id("gpu_memcpy")
    memset_cat = table.cat_id("gpu_memset")

    def gpu_union(cat: int) -> iv.Intervals:
        if cat == MISSING:
            return iv.merge(np.zeros(0, np.int64), np.zeros(0, np.int64))
        sel = (gpu.cat == cat) & own_work
        return iv.merge(gpu.start[sel], gpu.end[sel])

    def communication() -> iv.Intervals:
        empty = np.zeros(0, np.int64)
        return comm if comm is not None else (empty, empty)

    sets = [  # made one at a time: on a big trace each is tens of MB
        lambda: gpu_union(kernel_cat),
        lambda: gpu_union(memcpy_cat),
        lambda: gpu_union(memset_cat),
        communication,
        lambda: _host_union(table, _RUNTIME),
        lambda: _host_union(table, _CPU, DATALOADER_RE),
        lambda: _host_union(table, _CPU),
    ]
    lo, hi = steps.start, steps.end
    taken: iv.Intervals = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    parts = []
    covered = np.zeros(len(lo), dtype=np.int64)  # of `taken`, in each step
    for make in sets:
        intervals = make()
        # what this category adds to the union of those before it: its own time, nothing counted twice
        if not len(taken[0]):
            taken = intervals
        elif len(intervals[0]):
            both = (np.concatenate((taken[0], intervals[0])), np.concatenate((taken[1], intervals[1])))
            del taken, intervals
            taken = iv.merge(*both, owned=True)
            del both
        now = iv.covered_within(taken, lo, hi)
        parts.append(now - covered)
        covered = now
    dur = hi - lo
    other = np.maximum(dur - np.sum(parts, axis=0), 0)
    return [
        StepCategories(
            rank=data.rank,
            step=int(steps.number[i]),
            dur_us=ns_to_us(int(dur[i])),
            kernel_us=ns_to_us(int(parts[0][i])),
            memcpy_us=ns_to_us(int(parts[1][i])),
            memset_us=ns_to_us(int(parts[2][i])),
            communication_us=ns_to_us(int(parts[3][i])),
            runtime_us=ns_to_us(int(parts[4][i])),
            data_loader_us=ns_to_us(int(parts[5][i])),
            cpu_exec_us=ns_to_us(int(parts[6][i])),
            other_us=ns_to_us(int(other[i])),
        )
        for i in range(len(steps))
    ]


def add_comm_waiting(
    rows: list[StepCategories], steps: StepSpans, exposed: iv.Intervals, waiting: iv.Intervals
) -> None:
    """Split each step's communication into waiting for peers and transfer. `exposed`: the rank's
    communication category as intervals (exposed.communication_category); `waiting`: its waits for peers, a
    union (collectives.wait_intervals); both on the rank's own clock. Rows and steps are in the same order."""
    waited = iv.covered_within(iv.intersect(exposed, waiting), steps.start, steps.end)
    for row, wait_ns in zip(rows, waited.tolist(), strict=True):
        row.comm_wait_us = min(ns_to_us(wait_ns), row.communication_us)
        row.comm_transfer_us = round(row.communication_us - row.comm_wait_us, 3)


def _host_union(
    table: TraceTable, categories: tuple[str, ...], pattern: re.Pattern[str] | None = None
) -> iv.Intervals:
    """Union of the complete events of `categories` (names matching `pattern` only, when given), the
    ProfilerStep spans themselves left out (they cover the whole step)."""
    rows = table.complete_rows(*categories)
    if len(rows):
        name = table.columns["name"][rows]
        keep = table.names_matching(
            lambda n: _STEP.match(n) is None and (pattern is None or pattern.search(n) is not None),
            key=("overview", pattern.pattern if pattern is not None else None),
            among=name,
        )
        rows = rows[keep[name]]
    start = table.columns["ts"][rows]
    end = table.columns["dur"][rows]
    end += start
    return iv.merge(start, end, owned=True)
