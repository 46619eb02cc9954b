"""The slice of a trace every analyzer of one rank works on: its rows, its steps, its window, its GPU activity.

Built once per rank so that the analyzers agree on the window (HTA's convention: GPU activity belongs to the
window when the runtime call that launched it starts inside it).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import numpy as np

from stepscope.analysis.per_rank.kernels import MISSING_TS, CommPattern, GpuEvents, gpu_events
from stepscope.analysis.per_rank.steps import StepSpans, find_steps
from stepscope.analysis.read.table import TraceTable
from stepscope.errors import InputError


# Records of arrays: compared and printed by identity (a field-wise == of arrays raises, and their repr
# would print the arrays); generating __eq__ and __repr__ cost ~0.15 ms of every start.
class RankData(msgspec.Struct, eq=False):
    """One rank prepared for analysis; times in ns."""

    rank: int
    table: TraceTable  # the rank's rows only
    steps: StepSpans  # the steps inside the window
    all_steps: int  # how many ProfilerStep spans the rank has
    lo: int  # window [lo, hi)
    hi: int
    gpu_all: GpuEvents  # every GPU activity of the rank
    gpu: GpuEvents  # GPU activity launched inside the window
    notes: list[str] = msgspec.field(default_factory=list)

    @property
    def has_gpu(self) -> bool:
        return len(self.gpu) > 0


def effective_launch(gpu: GpuEvents) -> np.ndarray:
    """Launch time of each GPU event, falling back to its own start when no runtime call is correlated."""
    return np.where(gpu.launch == MISSING_TS, gpu.start, gpu.launch)


def _steps_between(
    table: TraceTable, rank: int, steps: StepSpans, first: int | None, last: int | None
) -> StepSpans:
    """The steps numbered `first` to `last` (inclusive; None: open); InputError when there are none."""
    keep = np.ones(len(steps), dtype=bool)
    if first is not None:
        keep &= steps.number >= first
    if last is not None:
        keep &= steps.number <= last
    if not keep.any():
        info = table.ranks.get(rank)
        have = f"#{steps.number[0]} to #{steps.number[-1]}" if len(steps) else "none"
        asked = f"{'' if first is None else first}:{'' if last is None else last}"
        raise InputError(
            info.source if info else "trace", f"no ProfilerStep in --steps {asked} (the trace has {have})"
        )
    return StepSpans(steps.number[keep], steps.start[keep], steps.end[keep])


def prepare_rank(
    table: TraceTable,
    rank: int,
    *,
    drop_last_step: bool = False,
    comm_patterns: Sequence[CommPattern] = (),
    steps: tuple[int | None, int | None] | None = None,
) -> RankData:
    """Select one rank, find its steps and window, and gather its GPU activity (`comm_patterns`: see
    kernels.gpu_events; `steps`: only the ProfilerSteps numbered first to last, see analyze)."""
    rank_col = table.columns["rank"]
    sub = table if bool((rank_col == rank).all()) else table.select(rank_col == rank)
    spans = find_steps(sub)
    notes: list[str] = []
    if steps is not None:
        spans = _steps_between(sub, rank, spans, *steps)
        first, last = int(spans.number[0]), int(spans.number[-1])
        which = f"ProfilerStep#{first}" + (f" to #{last}" if last != first else "")
        notes.append(f"{which} analysed (--steps)")
    gpu_all = gpu_events(sub, comm_patterns)
    n = len(spans)
    if n == 0:
        ts = sub.columns["ts"]
        lo = int(ts.min()) if len(ts) else 0
        hi = int((ts + sub.columns["dur"]).max()) + 1 if len(ts) else 0
        kept = spans
        notes.append("no ProfilerStep spans: the whole trace is analysed")
    else:
        if drop_last_step and n > 1:
            kept = spans.head(n - 1)
            hi = int(spans.start[-1])
        else:
            kept = spans
            hi = int(spans.end[-1])
            if drop_last_step:
                notes.append("only one ProfilerStep: --drop-last-step keeps it")
        lo = int(spans.start[0])
    launch = effective_launch(gpu_all)
    gpu = gpu_all.select((launch >= lo) & (launch < hi))
    if len(gpu_all) == 0:
        notes.append("no GPU activity in the trace: GPU breakdowns are empty")
    return RankData(rank, sub, kept, n, lo, hi, gpu_all, gpu, notes)


class RankDigest(msgspec.Struct, eq=False):
    """What the cross-rank analysis needs of one rank, small enough to come back from a worker process.

    `op_inside[i, j]`: self time in ns of the CPU ops named `op_names[i]` that start inside step j of the
    window; `op_gap[i, j]`: of those starting after step j ends and before step j + 1 starts. `comm`: the rank's
    time in communication, a union (None: none); `comm_exposed`: of it, the time with no other GPU activity
    (the overview's communication category: exposed.communication_category); `comm_shown`: of it, the time the
    step shows (exposed.exposed_communication: on a CPU job, while the training threads do not compute);
    `comm_unhidden`: the communication kernels' time under no computation kernel, which the GPU rules
    (`comm_bound`, `poor_overlap`) price (None: no communication kernel)."""

    rank: int
    lo: int
    hi: int
    steps: StepSpans
    world_size: int | None
    op_names: list[str] = msgspec.field(default_factory=list)
    op_inside: np.ndarray = msgspec.field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))
    op_gap: np.ndarray = msgspec.field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))
    comm: tuple[np.ndarray, np.ndarray] | None = None
    comm_exposed: tuple[np.ndarray, np.ndarray] | None = None
    comm_shown: tuple[np.ndarray, np.ndarray] | None = None
    comm_unhidden: tuple[np.ndarray, np.ndarray] | None = None
