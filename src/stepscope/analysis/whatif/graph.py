"""The dependency graph of one rank's window, from its trace alone: what each piece of work waited for.

Three kinds of node, times in ns on the rank's clock (docs/analysis.md, "Critical path and what-if"):

- **Host time**: the rank's CPU threads, as one timeline. Host work is sequential: what the host did between
  two instants takes as long as it took, unless a what-if scales it or a synchronization in it waits longer or
  shorter. Launches and synchronizations lie on it.
- **GPU activities** (kernels, copies, fills) on their streams. Each starts when the later of two things
  allows it: its stream finishing the activity before it (plus the gap the trace shows between them), and its
  launch (plus the launch latency the trace shows for it). Which of the two held it in the trace is recorded:
  an activity *follows its stream* when the stream was still busy at its launch, else it *follows its launch*.
  An activity may also wait for one activity elsewhere (events.py): the producer of an event its stream waits
  on, or the work before it in its CUDA graph; when that was the last to end it *follows it*, with the slack
  the trace shows. A delay the trace shows beyond these (a wait no trace event names) stays with the activity:
  the replay reproduces it and cannot move it.
- **Synchronizations**: host calls that wait for the GPU (device, stream and event synchronize; a blocking
  copy). Each waits for the GPU work it awaits, then takes the rest of its measured time (its own cost). What
  it awaits is the device's work launched before it for a device synchronize; the event's or the stream's work
  where a `cuda_sync` event names it (events.py); for the others, the stream whose work launched before the
  call ended last before the call returned, with the copy of a blocking copy.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
import numpy as np

from stepscope.analysis import intervals as iv
from stepscope.analysis.codes import distinct_sorted
from stepscope.analysis.per_rank.kernels import COMMUNICATION, MEMORY
from stepscope.analysis.per_rank.prepare import RankData, effective_launch
from stepscope.analysis.per_rank.steps import assign_phases, region_union
from stepscope.analysis.read.table import MISSING
from stepscope.analysis.whatif.events import INFER_WINDOW_NS, Activities, Edges, read_edges

# Calls that return only once the GPU work they await is done.
SYNC_RE = re.compile(
    r"^(?:cuda|hip)(?:DeviceSynchronize|StreamSynchronize|EventSynchronize|CtxSynchronize)$"
    r"|^cu(?:CtxSynchronize|StreamSynchronize|EventSynchronize)$"
)
DEVICE_SYNC_RE = re.compile(r"DeviceSynchronize|CtxSynchronize")
# Copies that may block the host (a copy to pageable memory returns once the copy is done).
COPY_RE = re.compile(r"^(?:cuda|hip)Memcpy(?:Async)?(?:DtoH|HtoD|DtoD)?$|^cuMemcpy")
# torch.compile's ranges: its compiled frames (dynamo) and their autograd functions (AOTAutograd), both directions
COMPILED_RE = re.compile(r"^Torch-Compiled Region|^CompiledFunction")
COMPILED_PHASE = (
    "\0compiled"  # RankGraph.phases' key of their union (a key no phase has; it overlaps the phases)
)
_RUNTIME_CATS = ("cuda_runtime", "cuda_driver", "runtime")
_X = ord("X")
_MIN = np.iinfo(np.int64).min


# Records of arrays: compared by identity (msgspec Structs: no __init__ compiled at import).
class GpuNodes(msgspec.Struct, eq=False):
    """The window's GPU activities in launch order."""

    name: np.ndarray  # index into names
    kind: np.ndarray  # kernels.COMPUTATION / COMMUNICATION / MEMORY
    stream: np.ndarray  # dense stream id (device and stream)
    launch: np.ndarray  # host time of the launch
    start: np.ndarray
    dur: np.ndarray
    prev: np.ndarray  # the activity before it on its stream, else -1
    gap: np.ndarray  # after its stream's previous activity ends (follows its stream), else 0
    latency: np.ndarray  # after its launch starts
    follows_stream: np.ndarray  # bool: its stream, not its launch, held it in the trace
    row: np.ndarray  # the activity's row in the rank's table (a CPU collective: its backend range's)
    after: (
        np.ndarray
    )  # the activity it also waits for (a stream wait's event; the same CUDA graph's), else -1
    after_gap: np.ndarray  # after that activity ends (the trace's slack when it held it in the trace, else 0)
    follows_after: np.ndarray  # bool: `after` held it in the trace
    graph: np.ndarray  # its CUDA graph (index into RankGraph.graph_names), else -1
    typical_latency: int = 0  # the median launch latency of the activities their launch held (ns)
    typical_gap: int = 0  # the median gap of the activities their stream held (ns)

    def __len__(self) -> int:
        return len(self.start)


class SyncNodes(msgspec.Struct, eq=False):
    """Host calls that waited for the GPU, by start."""

    start: np.ndarray
    end: np.ndarray
    stream: np.ndarray  # the stream awaited; -1: every stream (device synchronize)
    awaits: np.ndarray  # the last GPU activity (index into GpuNodes) launched before it on what it awaits; -1
    launched: np.ndarray  # how many GPU activities were launched before it (a prefix of GpuNodes)
    own: np.ndarray  # its time besides the waiting (ns)
    # bool: its own time is the host's wake-up once what it awaited ended, paid only where it waits (a blocking
    # wait for a CPU backend's collective: where the collective is removed or over, the host does not block)
    wakes: np.ndarray

    def __len__(self) -> int:
        return len(self.start)


class RankGraph(msgspec.Struct, eq=False):
    rank: int
    names: list[str]
    lo: int
    hi: int
    step_number: np.ndarray
    step_start: np.ndarray
    step_end: np.ndarray
    gpu: GpuNodes
    syncs: SyncNodes
    phases: dict[str, iv.Intervals]  # the host's phases (steps.assign_phases)
    data: RankData | None  # None once the graph travels without its trace (analyze's worker processes)
    graph_names: list[str] = []  # the CUDA graphs, by the CPU range around the launch
    notes: list[str] = []  # what the graph could not read from the trace
    unnamed_waits: int = 0  # stream waits the graph has no edge for (events.Edges)
    lanes: list[str] = []  # each stream's name (by GpuNodes.stream): "stream 7"
    # True: the activities are a CPU backend's collectives on its threads, no GPU (cpu_comm.py): what precedes
    # an activity's start after its launch is the backend starting it, not a kernel launch
    cpu_backend: bool = False
    # its replay with nothing scaled (replay.Replay), where one was made (findings/replayed.py) and the graph stays
    # in this process (analyze of one rank: _critical_path reuses it instead of replaying again); else None
    measured: Any = None


def build_graph(
    data: RankData, nodes: tuple[GpuNodes, SyncNodes] | None = None, infer_window_ns: int = INFER_WINDOW_NS
) -> RankGraph:
    """The graph of one prepared rank's window (see the module's doc). `nodes`: its activities and
    synchronizations where they are not the GPU's (cpu_comm.rank_graph: a CPU backend's collectives)."""
    edges = None
    if nodes is not None:
        gpu, syncs = nodes
    else:
        gpu, edges = _gpu_nodes(data, infer_window_ns)
        syncs = _sync_nodes(data, gpu, edges)
    steps = data.steps
    if len(steps):
        number, start, end = steps.number, steps.start, steps.end
    else:
        number = np.zeros(1, dtype=np.int64)
        start, end = np.array([data.lo], dtype=np.int64), np.array([data.hi], dtype=np.int64)
    phases = assign_phases(data.table)
    compiled = region_union(data.table, COMPILED_RE)
    if compiled is not None:
        phases = {**phases, COMPILED_PHASE: compiled}
    names = data.table.names
    graph = RankGraph(data.rank, names, data.lo, data.hi, number, start, end, gpu, syncs, phases, data)
    if edges is not None:
        graph.graph_names, graph.notes = edges.graph_names, edges.notes
        graph.unnamed_waits = edges.unnamed_waits
        graph.lanes = stream_names(data)
    return graph


def stream_names(data: RankData) -> list[str]:
    """The names of a rank's streams in the order of their dense ids (_gpu_nodes): "stream 7", with the device
    where the rank's activities ran on more than one."""
    g = data.gpu
    keys = distinct_sorted(g.device.astype(np.int64) * (1 << 32) + g.stream.astype(np.int64))
    devices, streams = (keys >> 32).tolist(), (keys & 0xFFFFFFFF).tolist()
    several = len(set(devices)) > 1
    return [
        f"device {d} stream {s}" if several else f"stream {s}" for d, s in zip(devices, streams, strict=True)
    ]


def _gpu_nodes(data: RankData, infer_window_ns: int = INFER_WINDOW_NS) -> tuple[GpuNodes, Edges]:
    g = data.gpu
    launch = effective_launch(g)
    order = np.lexsort((g.start, launch))
    launch, start, end = launch[order], g.start[order], g.end[order]
    stream_key = g.device[order].astype(np.int64) * (1 << 32) + g.stream[order].astype(np.int64)
    keys, stream = np.unique(stream_key, return_inverse=True)
    stream = stream.reshape(-1).astype(np.int64)
    corr = np.asarray(data.table.columns["correlation"][g.row[order]], dtype=np.int64)
    edges = read_edges(
        data.table, data.lo, data.hi, Activities(launch, start, end, stream, keys, corr), infer_window_ns
    )
    prev = previous_on_stream(stream)
    has_prev = prev >= 0
    prev_end = np.where(has_prev, end[np.maximum(prev, 0)], _MIN)
    after = edges.after
    after_end = np.where(after >= 0, end[np.maximum(after, 0)], _MIN)
    # what it waited for held it when that was still running at its launch and once its stream was free
    follows_after = (after >= 0) & (after_end >= launch) & (after_end >= prev_end)
    # the stream held it when its previous activity was still running at its launch
    follows_stream = has_prev & (prev_end > launch) & ~follows_after
    gap = np.where(follows_stream, np.maximum(start - prev_end, 0), 0)
    after_gap = np.where(follows_after, np.maximum(start - after_end, 0), 0)
    own_latency = np.maximum(start - launch, 0)
    held = follows_stream | follows_after
    typical = int(np.median(own_latency[~held])) if (~held).any() else 0
    latency = np.where(held, np.minimum(own_latency, typical), own_latency)
    nodes = GpuNodes(
        name=g.name[order],
        kind=g.kind[order],
        stream=stream.astype(np.int64),
        launch=launch,
        start=start,
        dur=end - start,
        prev=prev,
        gap=gap,
        latency=latency,
        follows_stream=follows_stream,
        row=g.row[order],
        after=after,
        after_gap=after_gap,
        follows_after=follows_after,
        graph=edges.graph,
        typical_latency=typical,
        typical_gap=int(np.median(gap[follows_stream])) if follows_stream.any() else 0,
    )
    return nodes, edges


def previous_on_stream(stream: np.ndarray) -> np.ndarray:
    """For activities in launch order on dense `stream` ids: the index of the one before each on its stream, -1
    for the first."""
    prev = np.full(len(stream), -1, dtype=np.int64)
    last: dict[int, int] = {}
    for i, s in enumerate(stream.tolist()):
        prev[i] = last.get(s, -1)
        last[s] = i
    return prev


def _sync_nodes(data: RankData, gpu: GpuNodes, edges: Edges) -> SyncNodes:
    table = data.table
    cols = table.columns
    cats = [c for c in (table.cat_id(x) for x in _RUNTIME_CATS) if c != MISSING]
    names = cols["name"]
    is_sync = table.name_values(lambda n: SYNC_RE.match(n) is not None, bool, key="whatif_sync")
    is_copy = table.name_values(lambda n: COPY_RE.match(n) is not None, bool, key="whatif_copy")
    is_device = table.name_values(lambda n: DEVICE_SYNC_RE.search(n) is not None, bool, key="whatif_device")
    ts, dur = cols["ts"], cols["dur"]
    # (the calls by name first, then the few of them tested: no mask of every row's other columns)
    rows = np.flatnonzero((is_sync | is_copy)[names])
    rows = rows[(cols["ph"][rows] == _X) & np.isin(cols["cat"][rows], cats)]
    rows = rows[(ts[rows] >= data.lo) & (ts[rows] < data.hi)]
    rows = rows[np.argsort(ts[rows], kind="stable")]
    host_threads = _host_threads(data)
    if host_threads is not None:
        rows = rows[np.isin(cols["tid"][rows], list(host_threads))]
    starts = ts[rows].astype(np.int64)
    end_gpu = (gpu.start + gpu.dur).tolist()
    # per call and stream, the last GPU activity launched on the stream by the call's start (-1: none)
    n_streams = int(gpu.stream.max()) + 1 if len(gpu) else 0
    last_on = np.full((len(rows), n_streams), -1, dtype=np.int64)
    for s in range(n_streams):
        ix = np.flatnonzero(gpu.stream == s)
        at = np.searchsorted(gpu.launch[ix], starts, side="right")
        last_on[:, s] = np.where(at > 0, ix[np.maximum(at, 1) - 1], -1)
    launched = np.searchsorted(gpu.launch, starts, side="right").tolist()
    gpu_stream = gpu.stream.tolist()
    ends = (starts + dur[rows]).tolist()
    name_of = names[rows]
    copies, devices = is_copy[name_of].tolist(), is_device[name_of].tolist()
    corrs = cols["correlation"][rows].tolist()
    out: dict[str, list[int]] = {k: [] for k in ("start", "end", "stream", "awaits", "own", "launched")}
    for k, (s, e, last) in enumerate(zip(starts.tolist(), ends, last_on.tolist(), strict=True)):
        found = [i for i in last if i >= 0]
        exact = _named(edges, corrs[k], last, end_gpu, e)
        if devices[k]:
            awaits, stream = (max(found, key=end_gpu.__getitem__) if found else -1), -1
        elif exact is not None:
            awaits, stream = exact, gpu_stream[exact]
        else:
            # the stream that drained last before the call returned: what it waited for
            done = [i for i in found if end_gpu[i] <= e]
            awaits = max(done, key=end_gpu.__getitem__) if done else -1
            stream = gpu_stream[awaits] if awaits >= 0 else -2
            if copies[k] and (awaits < 0 or end_gpu[awaits] <= s):
                continue  # a copy that did not wait: not a synchronization
        waited_until = max(s, end_gpu[awaits]) if awaits >= 0 else s
        out["start"].append(s)
        out["end"].append(e)
        out["stream"].append(stream)
        out["awaits"].append(awaits)
        out["own"].append(max(e - waited_until, 0))
        out["launched"].append(launched[k])
    a = {k: np.array(v, dtype=np.int64) for k, v in out.items()}
    return SyncNodes(**a, wakes=np.zeros(len(a["start"]), dtype=bool))


def _named(edges: Edges, corr: int, last: list[int], end_gpu: list[int], returned: int) -> int | None:
    """What the trace names a synchronization call as awaiting (an event synchronize's event; a stream
    synchronize's stream), unless the call returned before it ended (then it is inferred as without a name)."""
    if corr < 0:
        return None
    found = edges.host_awaits.get(corr)
    if found is None and (stream := edges.sync_stream.get(corr)) is not None and last[stream] >= 0:
        found = last[stream]
    return found if found is not None and end_gpu[found] <= returned else None


def _host_threads(data: RankData) -> set[int] | None:
    """The threads whose synchronizations hold the host timeline: those of the ProfilerStep spans (the training
    loop's); None (every thread) without steps."""
    if not len(data.steps):
        return None
    table = data.table
    cols = table.columns
    # (the spans by name first: an isin of every row's start against hundreds of steps sorts the whole column,
    # a hundred MB at a GB of JSON)
    is_step = table.name_values(lambda n: n.startswith("ProfilerStep"), bool, key="whatif_profiler_step")
    rows = np.flatnonzero(is_step[cols["name"]] & (cols["ph"] == _X))
    rows = rows[np.isin(cols["ts"][rows], data.steps.start)]
    tids = {int(t) for t in cols["tid"][rows].tolist()}
    return tids or None


KIND_LABELS = {COMMUNICATION: "communication", MEMORY: "memory"}
