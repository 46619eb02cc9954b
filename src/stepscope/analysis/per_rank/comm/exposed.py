"""Exposed communication: the part of a rank's communication that nothing else of the rank's work hides, so that
the step's time shows it.

- A rank with GPU activity: the communication with no other GPU activity (computation kernels, copies) at the
  same time.
- A rank without (CPU backends: gloo, mpi, ucc): the communication while the training threads do not compute.
  A backend runs each collective on its own thread; the training threads compute meanwhile unless they wait.
  They compute inside every CPU op (`cpu_op` events) of a thread that hosts no backend range, except the ops
  that issue or wait on a collective and every op around one (a c10d op, a functional collective,
  `record_param_comms`, an op named `*wait*`, and their enclosing ops), and except autograd's
  `autograd::engine::evaluate_function: ...` wrappers, whose own time is the hooks' (FSDP waits for its
  all-gathers there): the node's op and the hooks' ops inside the wrapper are counted by themselves. Python
  time between ops is not compute.
"""

from __future__ import annotations

import numpy as np

from stepscope.analysis import intervals as iv
from stepscope.analysis.per_rank.comm_names import BACKEND_RANGE, CPU_BACKENDS, cpu_collective
from stepscope.analysis.per_rank.kernels import COMMUNICATION
from stepscope.analysis.per_rank.prepare import RankData
from stepscope.analysis.per_rank.summary import op_tree
from stepscope.analysis.read.table import TraceTable

__all__ = ["communication_category", "exposed_communication", "training_compute"]

AUTOGRAD_WRAPPER = "autograd::engine::evaluate_function"


def exposed_communication(data: RankData, comm: iv.Intervals) -> iv.Intervals:
    """The part of `comm` (disjoint intervals) that the rank's other work does not hide (the module doc): with
    GPU activity, no other GPU activity at the same time; without, the training threads not computing
    (`training_compute`)."""
    if len(data.gpu_all):
        return communication_category(data, comm)
    return iv.subtract(comm, training_compute(data.table))


def communication_category(data: RankData, comm: iv.Intervals) -> iv.Intervals:
    """The part of `comm` with no other GPU activity at the same time: the overview's communication category
    (overview.step_categories ranks GPU work first, then communication, then the host's; on a rank without GPU
    activity, all of `comm`, CPU work at the same time included)."""
    other = data.gpu_all.select(data.gpu_all.kind != COMMUNICATION)
    if not len(other):
        return comm
    return iv.subtract(comm, iv.merge(other.start, other.end))


def _not_compute(name: str) -> bool:
    return cpu_collective(name) is not None or "wait" in name.lower() or name.startswith(AUTOGRAD_WRAPPER)


def _issues_or_waits(name: str) -> bool:
    return cpu_collective(name) is not None or "wait" in name.lower()


def training_compute(table: TraceTable) -> iv.Intervals:
    """The time in which the table's training threads compute (a union; the module doc says which ops count)."""
    tree = op_tree(table, ("cpu_op",))
    rows = tree.rows.astype(np.int64)
    if not len(rows):
        return iv.merge(np.zeros(0, np.int64), np.zeros(0, np.int64))
    names = table.columns["name"][rows]
    comm = table.name_values(_issues_or_waits, bool, key="exposed_issues_or_waits", among=names)[names]
    out = table.name_values(_not_compute, bool, key="exposed_not_compute", among=names)[names]
    # every op around one that issues or waits on a collective is waiting too
    up = tree.parent[np.flatnonzero(comm)].astype(np.int64)
    while len(up):
        up = up[up >= 0]
        up = up[~out[up]]
        out[up] = True
        up = tree.parent[up].astype(np.int64)
    backend = _backend_threads(table)
    if backend:
        pid, tid = table.columns["pid"][rows], table.columns["tid"][rows]
        for p, t in backend:
            out |= (pid == p) & (tid == t)
    kept = rows[~out]
    start = table.columns["ts"][kept].astype(np.int64)
    return iv.merge(start, start + table.columns["dur"][kept])


def _backend_threads(table: TraceTable) -> set[tuple[int, int]]:
    """(pid, tid) of the threads that run a CPU backend's collectives (those with a `gloo:...` range)."""
    names = table.columns["name"]

    def is_backend(name: str) -> bool:
        match = BACKEND_RANGE.match(name)
        return match is not None and match.group(1) in CPU_BACKENDS

    mask = table.name_values(is_backend, bool, key="exposed_backend_range", among=names)[names]
    rows = np.flatnonzero(mask)
    if not len(rows):
        return set()
    pairs = zip(table.columns["pid"][rows].tolist(), table.columns["tid"][rows].tolist(), strict=True)
    return {(int(p), int(t)) for p, t in pairs}
