"""Cross-stream edges of the graph (graph.py), read from the trace: CUDA events and stream waits, event and stream
synchronizations, CUDA graphs.

- **Stream waits.** `cudaEventRecord` records an event on a stream: it completes when the work launched on that
  stream before the call completes. `cudaStreamWaitEvent` makes a stream's later work wait for it. Newer Kineto
  traces write, beside each wait, a `cuda_sync` event "Stream Wait Event" naming the stream the event was
  recorded on (`wait_on_stream`) and the correlation id of its record call
  (`wait_on_cuda_event_record_corr_id`): the producer is the last activity launched on that stream before the
  record call, the consumer the first activity launched on the waiting stream after the wait call. Older traces
  (and some newer ones) give only the runtime calls, whose args name neither stream nor event: such a wait is
  inferred from timing where the first activity launched on the call's thread after it started within
  INFER_WINDOW_NS of an activity ending on another stream, after its launch and its stream had let it start
  (an edge marked inferred); the others are counted in a note and left as the trace shows them (inside the
  consumer's measured latency or gap).
- **Host synchronizations.** An "Event Sync" `cuda_sync` event with the same args names what a
  `cudaEventSynchronize` awaits exactly; a "Stream Sync" event names the stream (its thread) a
  `cudaStreamSynchronize` awaits.
- **CUDA graphs.** The activities of one `cudaGraphLaunch` share its correlation id. They replay as a unit from
  the launch: the first follows the launch (or its stream); each later one follows the activity of the same graph
  that ended last before it started, with the gap the trace shows (the graph's internal edges are not in the
  trace; this one is the latest that can have held it). Each graph is named after the innermost CPU range
  around its launch.
"""

from __future__ import annotations

import re

import msgspec
import numpy as np

from stepscope.analysis.codes import distinct_sorted
from stepscope.analysis.read.table import MISSING, SYNC_CATEGORY, TraceTable

RUNTIME_CATS = ("cuda_runtime", "cuda_driver", "runtime")
STREAM_WAIT_RE = re.compile(r"^(?:cuda|hip)StreamWaitEvent$|^cuStreamWaitEvent$")
GRAPH_LAUNCH_RE = re.compile(r"^(?:cuda|hip)GraphLaunch|^cuGraphLaunch")
_RANGE_CATS = ("cpu_op", "user_annotation")
_X = ord("X")
_SCAN = 64  # CPU ranges looked at, back from a graph launch, for the innermost one around it
# A stream wait the trace does not name is inferred where the activity after it started within this long of an
# activity ending on another stream, once its launch and its stream had let it start (_infer_waits)
INFER_WINDOW_NS = 5_000


class Edges(msgspec.Struct, eq=False):
    """What the trace says beyond launches and stream order, on the GPU activities in launch order (GpuNodes)."""

    after: np.ndarray  # the activity on another stream (or in the same CUDA graph) it also waits for, else -1
    from_graph: np.ndarray  # bool: `after` is an edge inside a CUDA graph (else a stream wait)
    graph: np.ndarray  # index into graph_names of the CUDA graph it belongs to, else -1
    graph_names: list[str]
    host_awaits: dict[int, int]  # correlation id of an event synchronize -> the activity it awaits
    sync_stream: dict[int, int]  # correlation id of a stream synchronize -> the stream (dense id) it awaits
    notes: list[str] = msgspec.field(default_factory=list)
    inferred: np.ndarray | None = None  # bool: `after` is a stream wait inferred from timing (_infer_waits)
    unnamed_waits: int = 0  # stream waits neither named by a record nor inferred: their delays are kept


class Activities(msgspec.Struct, eq=False):
    """The GPU activities as graph.py orders them (launch order): what the edges are read against."""

    launch: np.ndarray
    start: np.ndarray
    end: np.ndarray
    stream: np.ndarray  # dense stream id
    stream_keys: np.ndarray  # dense id -> device * 2**32 + stream
    corr: np.ndarray  # correlation id (of the launching call), -1


def read_edges(
    table: TraceTable, lo: int, hi: int, acts: Activities, infer_window_ns: int = INFER_WINDOW_NS
) -> Edges:
    """The edges of one rank's window (`table`: the rank's rows; see the module's doc)."""
    n = len(acts.launch)
    cols = table.columns
    by_stream = [np.flatnonzero(acts.stream == s) for s in range(len(acts.stream_keys))]
    dense = {int(k): i for i, k in enumerate(acts.stream_keys.tolist())}
    calls = _Calls(table)

    def last_before(key: int, t: int) -> int:
        """The last activity launched on stream `key` before host time t, else -1."""
        s = dense.get(key)
        if s is None:
            return -1
        ix = by_stream[s]
        at = int(np.searchsorted(acts.launch[ix], t, side="left"))
        return int(ix[at - 1]) if at else -1

    def first_after(key: int, t: int) -> int:
        s = dense.get(key)
        if s is None:
            return -1
        ix = by_stream[s]
        at = int(np.searchsorted(acts.launch[ix], t, side="right"))
        return int(ix[at]) if at < len(ix) else -1

    after = np.full(n, -1, dtype=np.int64)
    notes: list[str] = []
    sync = _sync_rows(table, lo, hi)
    host_awaits: dict[int, int] = {}
    sync_stream: dict[int, int] = {}
    named = 0
    for row, kind, key, wait_key, record in sync:
        corr = int(cols["correlation"][row])
        if kind == "Stream Sync":
            if key in dense:
                sync_stream[corr] = dense[key]
            continue
        record_ts = calls.ts_of(record) if record >= 0 and wait_key >= 0 else None
        producer = last_before(wait_key, record_ts) if record_ts is not None else -1
        if kind == "Event Sync":
            if producer >= 0:
                host_awaits[corr] = producer
            continue
        named += record_ts is not None
        call_ts = calls.ts_of(corr)
        consumer = first_after(key, int(cols["ts"][row]) if call_ts is None else call_ts)
        if producer < 0 or consumer < 0 or producer >= consumer:
            continue
        # the trace contradicts the edge when the consumer started before the producer ended: not used
        if acts.end[producer] > acts.start[consumer]:
            continue
        # of several waits before one activity, the one whose producer ends last holds it
        old = int(after[consumer])
        if old < 0 or acts.end[producer] > acts.end[old]:
            after[consumer] = producer
    waits = calls.count(STREAM_WAIT_RE, lo, hi)
    inferred = np.zeros(n, dtype=bool)
    if waits > named:
        inferred = _infer_waits(table, lo, hi, acts, calls, after, infer_window_ns)
        found = int(inferred.sum())
        left = waits - named - found
        if found:
            notes.append(
                f"{found} of {waits} stream waits (cudaStreamWaitEvent) name no event (no cuda_sync event; older "
                f"Kineto writes none) but are inferred from timing: the activity after the wait started within "
                f"{infer_window_ns / 1000:g} us of an activity ending on another stream, after its own stream and "
                "launch had let it start: it waits for that one (inferred)"
            )
        if left > 0:
            notes.append(
                f"{left} of {waits} stream waits (cudaStreamWaitEvent) have no cuda_sync event naming the event "
                "they wait on (wait_on_cuda_event_record_corr_id; older Kineto writes none), and their timing "
                "names none: their activities keep the delay the trace shows, and do not move with the work they "
                "waited for"
            )
    from_graph = np.zeros(n, dtype=bool)
    graph, names = _graphs(table, acts, calls, after, from_graph)
    unnamed = max(waits - named - int(inferred.sum()), 0)
    return Edges(after, from_graph, graph, names, host_awaits, sync_stream, notes, inferred, unnamed)


def _infer_waits(
    table: TraceTable,
    lo: int,
    hi: int,
    acts: Activities,
    calls: _Calls,
    after: np.ndarray,
    window_ns: int = INFER_WINDOW_NS,
) -> np.ndarray:
    """The stream waits the trace does not name, recovered from timing (item 2 of issue 43): the first activity
    launched on a thread after a `cudaStreamWaitEvent` call (its consumer), still without an edge, that started
    more than INFER_WINDOW_NS after both its launch and its stream's previous activity's end (something else held
    it), and within INFER_WINDOW_NS after an activity on another stream ended (the latest such): waits for that
    one. Returns which activities got such an edge (`after` is set). `window_ns`: INFER_WINDOW_NS, or
    more for whatif's bound on what the unnamed waits could change (predict.py)."""
    n = len(acts.launch)
    out = np.zeros(n, dtype=bool)
    cols = table.columns
    wait_name = table.name_values(lambda x: STREAM_WAIT_RE.match(x) is not None, bool, key="whatif_wait")
    rows = calls.rows[wait_name[cols["name"][calls.rows]]]
    rows = rows[(cols["ts"][rows] >= lo) & (cols["ts"][rows] < hi)]
    if not len(rows) or not n:
        return out
    # each activity's launch thread, through its launching call
    at = np.searchsorted(calls.corr, acts.corr)
    at = np.minimum(at, len(calls.corr) - 1)
    has_call = (
        (acts.corr >= 0) & (calls.corr[at] == acts.corr) if len(calls.corr) else np.zeros(n, dtype=bool)
    )
    launch_tid = np.where(has_call, cols["tid"][calls.rows[at]] if len(calls.corr) else -1, -1)
    consumers: set[int] = set()
    for tid in distinct_sorted(cols["tid"][rows]).tolist():  # (not np.unique: it imports numpy.ma)
        mine = np.flatnonzero(launch_tid == tid)
        if not len(mine):
            continue
        order = mine[np.argsort(acts.launch[mine], kind="stable")]
        waits = np.sort(cols["ts"][rows[cols["tid"][rows] == tid]])
        first = np.searchsorted(acts.launch[order], waits, side="right")
        consumers.update(int(order[i]) for i in first.tolist() if i < len(order))
    if not consumers:
        return out
    prev = np.full(n, -1, dtype=np.int64)
    for s in range(len(acts.stream_keys)):
        ix = np.flatnonzero(acts.stream == s)
        prev[ix[1:]] = ix[:-1]
    by_end = np.argsort(acts.end, kind="stable")
    ends = acts.end[by_end]
    for c in sorted(consumers):
        if after[c] >= 0:
            continue
        start = int(acts.start[c])
        ready = max(int(acts.launch[c]), int(acts.end[prev[c]]) if prev[c] >= 0 else 0)
        if start - ready <= INFER_WINDOW_NS:
            continue  # its launch or its stream let it start then: no wait held it
        lo_i = int(np.searchsorted(ends, start - window_ns, side="left"))
        hi_i = int(np.searchsorted(ends, start, side="right"))
        for j in range(hi_i - 1, lo_i - 1, -1):
            p = int(by_end[j])
            if acts.stream[p] != acts.stream[c]:
                after[c] = p
                out[c] = True
                break
    return out


class _Calls:
    """The rank's runtime calls (cudaLaunchKernel, cudaEventRecord, ...) by correlation id."""

    def __init__(self, table: TraceTable) -> None:
        cols = table.columns
        cats = [c for c in (table.cat_id(x) for x in RUNTIME_CATS) if c != MISSING]
        rows = np.flatnonzero((cols["ph"] == _X) & np.isin(cols["cat"], cats) & (cols["correlation"] >= 0))
        corr = np.asarray(cols["correlation"][rows], dtype=np.int64)
        order = np.argsort(corr, kind="stable")
        self.table = table
        self.rows = rows[order]
        self.corr = corr[order]

    def row_of(self, corr: int) -> int | None:
        at = int(np.searchsorted(self.corr, corr))
        return int(self.rows[at]) if at < len(self.corr) and self.corr[at] == corr else None

    def ts_of(self, corr: int) -> int | None:
        row = self.row_of(corr)
        return None if row is None else int(self.table.columns["ts"][row])

    def count(self, pattern: re.Pattern[str], lo: int, hi: int) -> int:
        hit = self.table.name_values(
            lambda n: pattern.match(n) is not None, bool, key=f"whatif_{pattern.pattern}"
        )
        names = self.table.columns["name"][self.rows]
        ts = self.table.columns["ts"][self.rows]
        return int((hit[names] & (ts >= lo) & (ts < hi)).sum())


def _sync_rows(table: TraceTable, lo: int, hi: int) -> list[tuple[int, str, int, int, int]]:
    """The window's `cuda_sync` events: (row, name, stream key, awaited stream key or -1, record correlation or
    -1). Kineto writes them on the device's process (pid) and the stream's thread (tid)."""
    cat = table.cat_id(SYNC_CATEGORY)
    if cat == MISSING or "args_wait_stream" not in table.columns:
        return []
    cols = table.columns
    rows = np.flatnonzero((cols["cat"] == cat) & (cols["ts"] >= lo) & (cols["ts"] < hi))
    out = []
    for row in rows.tolist():
        device, tid = int(cols["pid"][row]), int(cols["tid"][row])
        wait = int(cols["args_wait_stream"][row])
        key = (device << 32) + tid if device >= 0 and 0 <= tid < 2**32 else -1
        wait_key = (device << 32) + wait if device >= 0 and wait >= 0 else -1
        name = table.names[int(cols["name"][row])]
        out.append((row, name, key, wait_key, int(cols["args_wait_record"][row])))
    return out


def _graphs(
    table: TraceTable, acts: Activities, calls: _Calls, after: np.ndarray, from_graph: np.ndarray
) -> tuple[np.ndarray, list[str]]:
    """CUDA graphs: each activity's graph (index into the names), and the edges inside each (into `after`)."""
    n = len(acts.launch)
    graph = np.full(n, -1, dtype=np.int64)
    if not len(calls.rows):
        return graph, []
    is_launch = table.name_values(lambda s: GRAPH_LAUNCH_RE.match(s) is not None, bool, key="whatif_graph")
    launches = calls.rows[is_launch[table.columns["name"][calls.rows]]]
    if not len(launches):
        return graph, []
    corr = table.columns["correlation"]
    in_graph = np.isin(acts.corr, np.asarray(corr[launches], dtype=np.int64)) & (acts.corr >= 0)
    names: list[str] = []
    labels: dict[str, int] = {}
    ranges = _Ranges(table)
    for c in distinct_sorted(acts.corr[in_graph]).tolist():
        members = np.flatnonzero(acts.corr == c)
        label = ranges.around(calls.row_of(c))
        if label not in labels:
            labels[label] = len(names)
            names.append(label)
        graph[members] = labels[label]
        members = members[np.lexsort((members, acts.start[members]))]
        ends = acts.end[members]
        for k in range(1, len(members)):
            i = int(members[k])
            done = np.flatnonzero(ends[:k] <= acts.start[i])
            if not len(done):
                continue  # a root of the graph: it follows the launch
            p = int(members[done[np.argmax(ends[done])]])
            if p < i and after[i] < 0:
                after[i] = p
                from_graph[i] = True
    return graph, names


class _Ranges:
    """The rank's CPU ranges (ops, annotations) by start: the innermost one around a call."""

    def __init__(self, table: TraceTable) -> None:
        cols = table.columns
        cats = [c for c in (table.cat_id(x) for x in _RANGE_CATS) if c != MISSING]
        rows = np.flatnonzero((cols["ph"] == _X) & np.isin(cols["cat"], cats))
        self.table = table
        self.rows = rows[np.argsort(cols["ts"][rows], kind="stable")]
        self.ts = np.asarray(cols["ts"][self.rows], dtype=np.int64)

    def around(self, row: int | None) -> str:
        if row is None:
            return "CUDA graph"
        cols = self.table.columns
        t, end, tid = int(cols["ts"][row]), int(cols["ts"][row] + cols["dur"][row]), int(cols["tid"][row])
        at = int(np.searchsorted(self.ts, t, side="right"))
        for r in self.rows[max(at - _SCAN, 0) : at][::-1].tolist():
            if int(cols["tid"][r]) == tid and int(cols["ts"][r] + cols["dur"][r]) >= end:
                return f"CUDA graph ({self.table.names[int(cols['name'][r])]})"
        return "CUDA graph"
