"""The graph of a rank without GPU activity whose collectives a CPU backend ran (gloo, mpi, ucc): each collective
is an activity on its backend thread, and each wait of the training threads for collectives a synchronization.

- **Activities**: one per collective instance (its backend range), launched when the host called the op that
  issued it (`c10d::allreduce_`; the range's start where no op is paired with it) and started when its range
  starts (the backend's thread may pick it up later: its latency), in order on its backend thread (a thread runs
  one collective at a time). Across ranks, matched instances end together (couple.py): a rank's instance can
  only finish once the last rank has arrived.
- **Waits**: the longest stretch in which the training threads do not compute (exposed.training_compute) while a
  collective runs, if the host resumes from it when the collective ends, is the host waiting for it: a
  synchronization from the later of the stretch's start and the awaited collectives' launches to the stretch's
  end, awaiting every collective launched before it; the time from the last collective's end to the host's
  resumption is the host's wake-up (its own time, paid only where the host still waits in a replay: a
  collective a what-if removes takes its wake-up with it). The Python time before the wait stays host time. A
  backend range closes a little after the thread it releases resumes: a collective ending up to END_LAG_NS (or
  END_LAG_SHARE of its duration) after the stretch is awaited by it, and over when the stretch ends.
"""

from __future__ import annotations

import numpy as np

from stepscope.analysis import intervals as iv
from stepscope.analysis.codes import distinct_sorted, unique_inverse
from stepscope.analysis.per_rank.comm.collectives import Instances
from stepscope.analysis.per_rank.comm.exposed import training_compute
from stepscope.analysis.per_rank.kernels import COMMUNICATION
from stepscope.analysis.per_rank.prepare import RankData
from stepscope.analysis.whatif.events import INFER_WINDOW_NS
from stepscope.analysis.whatif.graph import GpuNodes, RankGraph, SyncNodes, build_graph, previous_on_stream

# A backend's range of a collective closes after the host thread it releases has resumed, by up to the larger
# of these (more on a busy machine, where the backend's thread waits for a core): an end that late still belongs
# to the stretch the host waited in.
END_LAG_NS = 1_000_000
END_LAG_SHARE = 0.25  # of the collective's duration


def rank_graph(
    data: RankData, instances: Instances | None, infer_window_ns: int = INFER_WINDOW_NS
) -> RankGraph:
    """The graph of one prepared rank (graph.build_graph); on a rank without GPU activity whose collectives a CPU
    backend ran (`instances`: collectives.rank_instances), with those collectives and the host's waits for them."""
    if not len(data.gpu) and instances is not None and instances.time_source == "cpu" and len(instances):
        graph = build_graph(data, cpu_collective_nodes(data, instances))
        # the activities' "streams" are the backend's threads (cpu_collective_nodes)
        tids = distinct_sorted(data.table.columns["tid"][instances.row.astype(np.int64)])
        graph.lanes = [f"thread {t} (collectives)" for t in tids.tolist()]
        graph.cpu_backend = True
        return graph
    return build_graph(data, infer_window_ns=infer_window_ns)


def cpu_collective_nodes(data: RankData, inst: Instances) -> tuple[GpuNodes, SyncNodes]:
    """The activities and synchronizations of a CPU-backend rank (see the module's doc)."""
    table = data.table
    rows = inst.row.astype(np.int64)
    order = np.lexsort((inst.end, inst.start))
    rows, start, end = rows[order], inst.start[order].astype(np.int64), inst.end[order].astype(np.int64)
    issue = np.minimum(inst.issue[order].astype(np.int64), start)
    _, stream = unique_inverse(table.columns["tid"][rows])
    n = len(rows)
    prev = previous_on_stream(stream)
    zeros = np.zeros(n, dtype=np.int64)
    gpu = GpuNodes(
        name=table.columns["name"][rows].astype(np.int64),
        kind=np.full(n, COMMUNICATION, dtype=np.int64),
        stream=stream.astype(np.int64),
        launch=issue,
        start=start,
        dur=end - start,
        prev=prev,
        gap=zeros,
        latency=start - issue,
        follows_stream=np.zeros(n, dtype=bool),
        row=rows,
        after=np.full(n, -1, dtype=np.int64),
        after_gap=zeros.copy(),
        follows_after=np.zeros(n, dtype=bool),
        graph=np.full(n, -1, dtype=np.int64),
    )
    return gpu, _waits(data, gpu)


def _waits(data: RankData, gpu: GpuNodes) -> SyncNodes:
    end = gpu.start + gpu.dur
    lo, hi = min(data.lo, int(gpu.start.min())), max(data.hi, int(end.max()))
    idle_start, idle_end = iv.complement(training_compute(data.table), lo, hi)
    # each collective: of the stretches without compute while it runs, the longest in it, if the host resumed
    # from it no earlier than a little before the collective's end (else the host computed meanwhile)
    lag = np.maximum(END_LAG_NS, (END_LAG_SHARE * gpu.dur).astype(np.int64))
    first = np.searchsorted(idle_end, gpu.start, side="right")
    past = np.searchsorted(idle_start, end, side="left")
    k = np.full(len(gpu), -1, dtype=np.int64)
    for i, (f, p) in enumerate(zip(first.tolist(), past.tolist(), strict=True)):
        if f < p:
            inside = np.minimum(idle_end[f:p], end[i]) - np.maximum(idle_start[f:p], gpu.start[i])
            k[i] = f + int(np.argmax(inside))
    waited = (k >= 0) & (idle_end[np.maximum(k, 0)] >= end - lag)
    out: dict[str, list[int]] = {k: [] for k in ("start", "end", "stream", "awaits", "own", "launched")}
    for stretch in distinct_sorted(k[waited]).tolist():
        awaited = np.flatnonzero(waited & (k == stretch))
        a, b = int(idle_start[stretch]), int(idle_end[stretch])
        s = max(a, int(gpu.launch[awaited].max()))
        if s >= b:
            continue
        # a backend range may close after the host it released resumed: the collective is over by then
        late = awaited[end[awaited] > b]
        gpu.dur[late] = b - gpu.start[late]
        end[late] = b
        last = int(awaited[np.argmax(end[awaited])])
        out["start"].append(s)
        # the host resumes at the stretch's end: the time after the collective's end is its wake-up
        out["end"].append(b)
        out["stream"].append(-1)
        out["awaits"].append(last)
        out["own"].append(b - int(end[last]))
        out["launched"].append(int(np.searchsorted(gpu.launch, s, side="right")))
    arrays = {k: np.array(v, dtype=np.int64) for k, v in out.items()}
    return SyncNodes(**arrays, wakes=np.ones(len(arrays["start"]), dtype=bool))
