"""The critical path of each step of a replay: walking back from the step's end, what held each instant.

On the host, time runs back to the synchronization before it; a synchronization that waited for the GPU hands
the path to the activity it waited for; an activity hands it to its stream's previous activity (it followed its
stream), to the activity it waited for on another stream or in its CUDA graph (it followed that), or to its
launch on the host (it followed its launch). A CUDA graph's activities are named `<graph> > <kernel>`. Of the
host time on the path, the part inside torch.compile's ranges (graph.COMPILED_RE) is also told apart. With ranks
replayed together (couple.py), a collective that waited for a later rank hands the path to that rank, at its
arrival. Each stretch is counted by kind (docs/analysis.md, "The critical path", says what each means): host
(by phase: data_loader / forward / backward / optimizer / other), GPU computation, communication, memory, launch
latency (a kernel's, from its launch), dispatch (a CPU backend's collective, from the host's call to its thread
starting it: no GPU kind appears on a rank without GPU activity), gaps between activities of a stream,
synchronization (its own time).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple

import msgspec
import numpy as np

from stepscope.analysis.per_rank.kernels import KIND_NAMES
from stepscope.analysis.whatif.fidelity import ReplayFidelity
from stepscope.analysis.whatif.graph import COMPILED_PHASE, RankGraph
from stepscope.analysis.whatif.replay import Replay

if TYPE_CHECKING:
    from stepscope.analysis.whatif.couple import Coupling

MAX_HOPS = 10_000  # hand-overs between ranks in one step's walk (a bound: each moves the walk back in time)
PATH_KINDS = (
    "host", "computation", "communication", "memory", "launch", "unexplained", "dispatch", "gap", "sync",
)  # fmt: skip
# A GPU activity that started this many times later after its launch than the rank's typical launch latency
# (GpuNodes.typical_latency), or after the activity before it on its stream than the typical gap (typical_gap),
# and at least UNEXPLAINED_MIN_NS later, its stream idle and no awaited activity the trace shows, waited for
# something the trace does not show: beyond the typical latency or gap that is an "unexplained" wait, not launch
# latency or a gap between kernels (a stream wait without its event's record, another process's work)
UNEXPLAINED_FACTOR = 10
UNEXPLAINED_MIN_NS = 50_000


class PathSegment(msgspec.Struct):
    """Time on the critical path spent on one rank in one kind of work (a host phase: `host: forward`)."""

    rank: int
    what: str
    ms: float


class Span(NamedTuple):
    """One stretch of a step's critical path, in its rank's replay time (ns)."""

    rank: int
    lane: int  # -1: the host; else the stream of the activity (GpuNodes.stream)
    start: int
    end: int
    what: str  # a kind (PATH_KINDS) or the host's phase ("host: forward")
    activity: int  # the GPU activity (index into GpuNodes), else -1


class PathStep(msgspec.Struct):
    """The critical path of one step: ms by kind, and the host time by phase; with ranks coupled, the path may
    pass from rank to rank (`segments` says where its time went)."""

    step: int
    step_ms: float
    by_kind_ms: dict[str, float]
    host_by_phase_ms: dict[str, float]
    top: list[tuple[str, float]]  # the GPU activities (by name) longest on the path, ms
    segments: list[PathSegment] = msgspec.field(default_factory=list)  # by rank and kind, longest first
    host_compiled_ms: float = 0.0  # of the host time on the path, inside torch.compile regions
    unexplained_waits: int = 0  # GPU activities on the path that waited for what the trace does not show


def critical_path(rep: Replay, top: int = 5) -> list[PathStep]:
    """Per step of one rank's replay, its critical path (see the module's doc)."""
    return job_critical_path({rep.graph.rank: rep}, None, top=top)


def job_critical_path(
    replays: Mapping[int, Replay], coupling: Coupling | None, top: int = 5, segments: int = 8
) -> list[PathStep]:
    """Per step, the critical path of the ranks replayed together (couple.replay_job): from the end of the rank
    whose step ends last, back to its step's start; a collective that waited for a later rank hands the path to
    that rank at its arrival."""
    ranks = sorted(replays)
    last_in = _last_arrivals(replays, coupling) if coupling is not None and len(coupling) else {}
    n_steps = min(len(replays[r].step_start) for r in ranks)
    labels: dict[int, list[str]] = {}  # per rank, its activities' names on the path (made when first needed)
    out = []
    for k in range(n_steps):
        walk, rank = walk_step(replays, coupling, k, labels, last_in)
        step_ns = sum(walk.kinds.values())  # from the end back to the step's start on the rank it reached
        names_top = [(name, round(v / 1e6, 3)) for name, v in walk.names.most_common(top)]
        parts = sorted(walk.parts.items(), key=lambda item: (-item[1], item[0]))
        out.append(
            PathStep(
                step=int(replays[rank].graph.step_number[k]),
                step_ms=round(step_ns / 1e6, 3),
                by_kind_ms={
                    kind: round(walk.kinds[kind] / 1e6, 3) for kind in PATH_KINDS if walk.kinds[kind]
                },
                host_by_phase_ms={
                    p: round(v / 1e6, 3) for p, v in walk.host.items() if v and p != COMPILED_PHASE
                },
                top=names_top,
                segments=[PathSegment(r, what, round(v / 1e6, 3)) for (r, what), v in parts[:segments] if v],
                host_compiled_ms=round(walk.host[COMPILED_PHASE] / 1e6, 3),
                unexplained_waits=walk.unexplained,
            )
        )
    return out


def walk_step(
    replays: Mapping[int, Replay],
    coupling: Coupling | None,
    k: int,
    labels: dict[int, list[str]],
    last_in: dict[tuple[int, int], tuple[int, int]] | None = None,
    spans: list[Span] | None = None,
) -> tuple[_Walk, int]:
    """Step `k`'s walk back from the end of the rank whose step ends last (returned with it); `spans`, where
    given, receives each stretch of the path. `last_in`: _last_arrivals's (made here where not given)."""
    ranks = sorted(replays)
    offsets = coupling.offsets if coupling is not None else {r: 0 for r in ranks}
    if last_in is None:
        last_in = _last_arrivals(replays, coupling) if coupling is not None and len(coupling) else {}
    ends = {r: int(replays[r].step_end[k]) - offsets[r] for r in ranks}
    rank = max(ranks, key=lambda r: (ends[r], -r))
    walk = _Walk(replays, k, labels, spans)
    walk.run(rank, last_in, coupling)
    return walk, rank


def _last_arrivals(
    replays: Mapping[int, Replay], coupling: Coupling
) -> dict[tuple[int, int], tuple[int, int]]:
    """(rank, activity) of a coupled collective that waited for a later rank -> (that rank, its activity)."""
    out: dict[tuple[int, int], tuple[int, int]] = {}
    for where in coupling.activity:
        if not all(r in replays for r in where):
            continue
        arrival = {r: int(replays[r].gpu_start[a]) - coupling.offsets[r] for r, a in where.items()}
        last = max(arrival, key=lambda r: (arrival[r], -r))
        for r, a in where.items():
            if arrival[r] < arrival[last]:
                out[(r, a)] = (last, where[last])
    return out


class _Walk:
    """One step's walk back along the critical path, counting its time by kind, host phase, rank and name."""

    def __init__(
        self,
        replays: Mapping[int, Replay],
        k: int,
        labels: dict[int, list[str]],
        spans: list[Span] | None = None,
    ) -> None:
        self.replays = replays
        self.k = k
        self.kinds: Counter[str] = Counter()
        self.host: Counter[str] = Counter()
        self.names: Counter[str] = Counter()
        self.parts: Counter[tuple[int, str]] = Counter()
        self._labels = labels
        self.spans = spans  # where given, each stretch of the path is appended to it (timeline.py)
        self.unexplained = 0  # activities on the path with an unexplained wait

    def _span(self, rank: int, lane: int, lo: int, hi: int, what: str, activity: int = -1) -> None:
        """Record one stretch of the path, in the rank's replay time; `lane`: -1 the host, else the activity's
        stream (GpuNodes.stream)."""
        if self.spans is not None and hi > lo:
            self.spans.append(Span(rank, lane, lo, hi, what, activity))

    def label(self, rank: int, a: int) -> str:
        if rank not in self._labels:
            self._labels[rank] = _labels(self.replays[rank].graph)
        return self._labels[rank][a]

    def _count(self, rank: int, kind: str, ns: int) -> None:
        if ns > 0:
            self.kinds[kind] += ns
            self.parts[(rank, kind)] += ns

    def run(
        self,
        rank: int,
        last_in: dict[tuple[int, int], tuple[int, int]],
        coupling: Coupling | None,
    ) -> None:
        rep = self.replays[rank]
        k = self.k
        t, tm = int(rep.step_end[k]), int(rep.graph.step_end[k])
        limit = len(rep.sync_end) - 1
        hops = 0
        while True:
            g = rep.graph
            gpu, syncs = g.gpu, g.syncs
            t_lo, tm_lo = int(rep.step_start[k]), int(g.step_start[k])
            if t <= t_lo:
                return
            # the last synchronization over by t (never one already walked)
            j = min(int(np.searchsorted(rep.sync_end, t, side="right")) - 1, limit)
            if j < 0 or rep.sync_end[j] <= t_lo:
                self._host(rank, rep, (t_lo, t), (tm_lo, tm))
                return
            self._host(rank, rep, (int(rep.sync_end[j]), t), (int(syncs.end[j]), tm))
            s, e = int(rep.sync_start[j]), int(rep.sync_end[j])
            limit = j - 1
            ready = e - int(syncs.own[j])
            self._count(rank, "sync", e - max(ready, s))
            self._span(rank, -1, max(ready, s), e, "sync")
            a = _awaited(rep, j)
            if a < 0 or ready <= s:
                t, tm = s, int(syncs.start[j])
                continue
            # on the GPU (or a CPU backend's thread): back through the chain of activities that ended at `ready`
            t_gpu = ready
            jumped = False
            launch_host = rep.gpu_start - gpu.latency
            while a >= 0 and t_gpu > t_lo:
                start = int(rep.gpu_start[a])
                jump = last_in.get((rank, a)) if hops < MAX_HOPS else None
                if jump is not None and coupling is not None:
                    # it waited for a later rank: the transfer is this rank's, the rest of the path the other's
                    peer, pa = jump
                    other = self.replays[peer]
                    arrival = int(other.gpu_start[pa]) - coupling.offsets[peer] + coupling.offsets[rank]
                    self._count(rank, KIND_NAMES[int(gpu.kind[a])], t_gpu - max(arrival, t_lo))
                    lane = int(gpu.stream[a])
                    self._span(rank, lane, max(arrival, t_lo), t_gpu, KIND_NAMES[int(gpu.kind[a])], a)
                    self.names[self.label(rank, a)] += max(t_gpu - max(arrival, t_lo), 0)
                    hops += 1
                    jumped = True
                    rank, rep, a = peer, other, pa
                    g, gpu, syncs = rep.graph, rep.graph.gpu, rep.graph.syncs
                    t_lo, tm_lo = int(rep.step_start[k]), int(g.step_start[k])
                    launch_host = rep.gpu_start - gpu.latency
                    limit = len(rep.sync_end) - 1
                    t_gpu = int(rep.gpu_start[a])
                    start = t_gpu
                else:
                    spent = t_gpu - max(start, t_lo)
                    self._count(rank, KIND_NAMES[int(gpu.kind[a])], spent)
                    self._span(
                        rank, int(gpu.stream[a]), max(start, t_lo), t_gpu, KIND_NAMES[int(gpu.kind[a])], a
                    )
                    self.names[self.label(rank, a)] += max(spent, 0)
                    t_gpu = start
                prev, after = int(gpu.prev[a]), int(gpu.after[a])
                prev_end = int(rep.gpu_end[prev]) if prev >= 0 else None
                after_end = int(rep.gpu_end[after]) if after >= 0 else None
                if prev_end is not None and prev_end + gpu.gap[a] >= start:
                    gap_end = start
                    usual = int(gpu.typical_gap)
                    if start - prev_end > max(UNEXPLAINED_FACTOR * usual, UNEXPLAINED_MIN_NS):
                        # its stream idle long after the work before it ended: beyond the usual gap it waited for
                        # what the trace does not show
                        gap_end = prev_end + usual
                        self._count(rank, "unexplained", start - gap_end)
                        self._span(rank, int(gpu.stream[a]), gap_end, start, "unexplained")
                        self.unexplained += 1
                    self._count(rank, "gap", gap_end - prev_end)
                    self._span(rank, int(gpu.stream[a]), prev_end, gap_end, "gap")
                    t_gpu = prev_end
                    a = prev
                elif after_end is not None and after_end + gpu.after_gap[a] >= start:
                    # it waited for work on another stream (an event) or before it in its CUDA graph
                    self._count(rank, "gap", start - after_end)
                    self._span(rank, int(gpu.stream[a]), after_end, start, "gap")
                    t_gpu = after_end
                    a = after
                else:
                    # a CPU backend's collective waited for its thread to start it: no kernel was launched
                    started = "dispatch" if g.cpu_backend else "launch"
                    latency, usual = int(gpu.latency[a]), int(gpu.typical_latency)
                    if not g.cpu_backend and latency > max(UNEXPLAINED_FACTOR * usual, UNEXPLAINED_MIN_NS):
                        # beyond the usual latency it waited for what the trace does not show
                        waited_from = int(launch_host[a]) + usual
                        self._count(rank, "unexplained", start - waited_from)
                        self._span(rank, int(gpu.stream[a]), waited_from, start, "unexplained")
                        self.unexplained += 1
                        latency, start = usual, waited_from
                    self._count(rank, started, latency)
                    self._span(rank, int(gpu.stream[a]), int(launch_host[a]), start, started)
                    t_gpu = int(launch_host[a])
                    break
            if rep is not self.replays[rank] or (a >= 0 and t_gpu < s) or jumped:
                t, tm = t_gpu, int(gpu.launch[a]) if a >= 0 else tm_lo
            else:
                t, tm = min(t_gpu, s), int(syncs.start[j])

    def _host(self, rank: int, rep: Replay, span: tuple[int, int], measured: tuple[int, int]) -> None:
        """Host time `span` of the replay on the path, by phase: the phases' measured intervals inside
        `measured` (the same stretch in the trace's time), each as long as the replay's clock makes it."""
        lo, hi = span
        if hi <= lo:
            return
        self.kinds["host"] += hi - lo
        m_lo, m_hi = measured
        covered = 0
        shown: list[tuple[int, int, str]] = []
        for phase, (start, end) in rep.graph.phases.items():
            a, b = np.maximum(start, m_lo), np.minimum(end, m_hi)
            keep = b > a
            if keep.any():
                ra, rb = rep.clock(a[keep]), rep.clock(b[keep])
                part = int((rb - ra).sum())
                self.host[phase] += part
                if phase != COMPILED_PHASE:  # (it overlaps the phases)
                    self.parts[(rank, f"host: {phase}")] += part
                    covered += part
                    if self.spans is not None:
                        # the replay's stretch starts at `lo` where the measured one starts at m_lo
                        shift = lo - int(rep.clock(np.array([m_lo]))[0])
                        shown += [
                            (x + shift, y + shift, f"host: {phase}")
                            for x, y in zip(ra.tolist(), rb.tolist(), strict=True)
                        ]
        if hi - lo - covered > 0:
            self.host["other"] += hi - lo - covered
            self.parts[(rank, "host: other")] += hi - lo - covered
        if self.spans is not None:
            at = lo
            for x, y, what in sorted(shown):
                x, y = max(x, at), min(y, hi)
                self._span(rank, -1, at, x, "host: other")
                self._span(rank, -1, x, y, what)
                at = max(at, y)
            self._span(rank, -1, at, hi, "host: other")


def _labels(g: RankGraph) -> list[str]:
    """Each GPU activity's name on the path: a CUDA graph's activities as `<graph> > <kernel>`."""
    names, graphs = g.names, g.graph_names
    return [
        f"{graphs[k]} > {names[c]}" if k >= 0 else names[c]
        for c, k in zip(g.gpu.name.tolist(), g.gpu.graph.tolist(), strict=True)
    ]


def _awaited(rep: Replay, j: int) -> int:
    """The activity a synchronization waited for in the replay (the latest to end of what it awaits)."""
    syncs = rep.graph.syncs
    if syncs.awaits[j] < 0:
        return -1
    if syncs.stream[j] != -1:
        return int(syncs.awaits[j])
    n = int(syncs.launched[j])
    return int(np.argmax(rep.gpu_end[:n])) if n else -1


HOST_LANE = "host"


class TimelineSpan(msgspec.Struct):
    """A stretch of work on one lane (a rank's host, or one of its streams), in ms from the step's start."""

    rank: int
    lane: str
    start_ms: float
    end_ms: float
    what: str  # a kind of the path (PATH_KINDS) or a host phase: "host: forward"
    name: str | None = None  # the activity's name, where the stretch is one activity's


class PathTimeline(msgspec.Struct):
    """One step's critical path over the step's work (timeline.py)."""

    step: int | None  # the step's number on the rank whose step ends last; None: the window, no step marked
    step_ms: float  # the path's length
    path: list[TimelineSpan]  # in time order
    busy: list[TimelineSpan]  # the step's work on every lane of the ranks replayed
    aligned: bool = True  # False: the ranks' clocks could not be aligned; each is drawn from its step's start


class CriticalPath(msgspec.Struct):
    """The job's critical path over the window's steps, as means per step (analyze's `critical_path`)."""

    steps: int
    step_ms: float  # the path's length: from the last rank's end back to the step's start where it leads
    replay_error_pct: float | None  # the replay's mean step (slowest rank) against the measured one
    by_kind_ms: dict[str, float]
    host_by_phase_ms: dict[str, float]
    segments: list[PathSegment]  # by rank and kind, longest first
    top: list[tuple[str, float]]  # the GPU activities longest on the path
    bound: str | None  # the longest segment, in words: "rank 2, host: data_loader: 30.3 ms of 46.8 ms (65%)"
    timeline: PathTimeline | None = None  # a typical step's path over its work (timeline.py)
    replay: list[ReplayFidelity] = []  # per rank, the replay against the measured steps (fidelity.py)
    unexplained_waits: float = (
        0.0  # per step (mean): GPU activities on the path waiting for what no trace shows
    )
    approximate: bool = False  # a rank's replay is off by more than REPLAY_TRUST_PCT: the path is approximate


def summarize_path(
    steps: list[PathStep], replay_error_pct: float | None, top: int = 5
) -> CriticalPath | None:
    """The means over `steps` (job_critical_path's); None without steps."""
    if not steps:
        return None
    n = len(steps)
    kinds: Counter[str] = Counter()
    host: Counter[str] = Counter()
    parts: Counter[tuple[int, str]] = Counter()
    names: Counter[str] = Counter()
    for p in steps:
        kinds.update(p.by_kind_ms)
        host.update(p.host_by_phase_ms)
        parts.update({(s.rank, s.what): s.ms for s in p.segments})
        names.update(dict(p.top))
    step_ms = sum(p.step_ms for p in steps) / n
    ordered = sorted(parts.items(), key=lambda item: (-item[1], item[0]))
    segments = [PathSegment(r, what, round(v / n, 3)) for (r, what), v in ordered[:8]]
    bound = None
    if segments and step_ms > 0:
        s = segments[0]
        bound = f"rank {s.rank}, {s.what}: {s.ms:.1f} ms of {step_ms:.1f} ms ({100 * s.ms / step_ms:.0f}%)"
    return CriticalPath(
        unexplained_waits=round(sum(p.unexplained_waits for p in steps) / n, 2),
        steps=n,
        step_ms=round(step_ms, 3),
        replay_error_pct=replay_error_pct,
        by_kind_ms={k: round(kinds[k] / n, 3) for k in PATH_KINDS if kinds[k]},
        host_by_phase_ms={k: round(v / n, 3) for k, v in host.items() if v},
        segments=segments,
        top=[(name, round(v / n, 3)) for name, v in names.most_common(top)],
        bound=bound,
    )
