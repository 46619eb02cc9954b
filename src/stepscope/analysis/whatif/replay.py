"""Re-time one rank's graph (graph.py) with its measured durations, or with some of them scaled (a what-if).

The host timeline keeps its measured time, scaled where a what-if scales host work; each synchronization takes
the time its awaited GPU work now needs; GPU activities start when their stream, their launch and what they
wait for on another stream (an event; the same CUDA graph's work) allow. One pass
in the order of the trace: a synchronization only awaits work launched before it, and an activity only follows
activities launched before it.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import msgspec
import numpy as np

from stepscope.analysis.codes import distinct_sorted
from stepscope.analysis.whatif.graph import RankGraph

_NEG = np.iinfo(np.int64).min // 4
_CHUNK = 1 << 15  # activities whose inputs replay_steps holds as Python lists at once


class Scaling(msgspec.Struct):
    """What a what-if changes on one rank: host intervals (start, end, factor), a factor per GPU activity
    (index into GpuNodes), a factor for synchronizations. Factors multiply where selections overlap."""

    host: list[tuple[np.ndarray, np.ndarray, float]] = []
    gpu: np.ndarray | None = None  # float factor per GPU activity; None: all 1
    sync: float = 1.0
    # per selector (its text): the GPU activities and host intervals (or synchronization factor) it took
    matched: dict[str, int] = {}


# Records of arrays: compared by identity (msgspec Structs: no __init__ compiled at import).
class Coupled(msgspec.Struct, eq=False):
    """A rank's activities tied to other ranks' (couple.py): per activity, its match (-1: none) and the time it
    takes once the last rank arrived (ns)."""

    match: np.ndarray
    transfer: np.ndarray


class Replay(msgspec.Struct, eq=False):
    graph: RankGraph
    gpu_start: np.ndarray
    gpu_end: np.ndarray
    sync_start: np.ndarray
    sync_end: np.ndarray
    step_start: np.ndarray
    step_end: np.ndarray
    clock: Any  # _HostClock: measured host time -> replayed, before the synchronizations

    @property
    def step_ns(self) -> np.ndarray:
        return self.step_end - self.step_start


class _HostClock:
    """Measured host time -> replayed host time, before the synchronizations' changes: each stretch of time
    multiplied by the factors of the host intervals that cover it; a synchronization's own stretch is waiting,
    which host intervals do not scale (the replay re-times it)."""

    def __init__(self, graph: RankGraph, scaling: Scaling) -> None:
        syncs = graph.syncs
        lo = min(graph.lo, int(graph.gpu.launch.min()) if len(graph.gpu) else graph.lo)
        hi = max(graph.hi, int(syncs.end.max()) if len(syncs) else graph.hi)
        edges = [np.array([lo, hi], dtype=np.int64), syncs.start, syncs.end]
        for start, end, _ in scaling.host:
            edges += [start, end]
        points = distinct_sorted(np.clip(np.concatenate(edges), lo, hi))
        mid = (points[:-1] + points[1:]) // 2
        rate = np.ones(len(mid))
        for start, end, factor in scaling.host:
            order = np.argsort(start, kind="stable")
            s, e = start[order], end[order]
            # intervals of one selection are disjoint (unions); a midpoint lies in at most one
            at = np.searchsorted(s, mid, side="right") - 1
            inside = (at >= 0) & (mid < e[np.maximum(at, 0)])
            rate[inside] *= factor
        if len(syncs):
            in_sync = np.searchsorted(syncs.start, mid, side="right") - 1
            rate[(in_sync >= 0) & (mid < syncs.end[np.maximum(in_sync, 0)])] = 1.0
        # times relative to lo: float64 holds a few hundred ns too few digits for epoch nanoseconds
        self.lo = lo
        self.points = (points - lo).astype(np.float64)
        self.cum = np.concatenate(([0.0], np.cumsum(np.diff(points) * rate)))

    def __call__(self, t: np.ndarray) -> np.ndarray:
        rel = np.asarray(t, dtype=np.int64) - self.lo
        return np.round(np.interp(rel, self.points, self.cum)).astype(np.int64) + self.lo


def replay(graph: RankGraph, scaling: Scaling | None = None) -> Replay:
    """The graph re-timed (see the module's doc); nothing scaled: the trace as measured, up to what the graph
    cannot explain."""
    steps = replay_steps(graph, scaling)
    try:
        next(steps)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    raise AssertionError("a replay without coupled activities never waits for another rank")


def replay_steps(
    graph: RankGraph, scaling: Scaling | None = None, coupled: Coupled | None = None
) -> Generator[tuple[int, int], int, Replay]:
    """The replay of `graph` as a generator: at each activity `coupled` ties to other ranks' (a collective), it
    yields (the match, the activity's start) and is sent back when the last of the match's ranks arrived (the
    latest start, in this rank's clock); it returns the Replay. Without `coupled`, it never yields."""
    scaling = scaling or Scaling()
    clock = _HostClock(graph, scaling)
    gpu, syncs = graph.gpu, graph.syncs
    if coupled is None and (by_stream := _by_stream(graph, clock, scaling)) is not None:
        start_a, end_a, sync_start_a, sync_end_a, cum = by_stream
        step_start, step_end = (
            _host(graph, clock, cum, graph.step_start),
            _host(graph, clock, cum, graph.step_end),
        )
        return Replay(graph, start_a, end_a, sync_start_a, sync_end_a, step_start, step_end, clock)
    n = len(gpu)
    clocked = clock(gpu.launch)
    # the activities' inputs as lists a chunk at a time (a list holds 40 bytes per value: all of them at once
    # are 11 lists of every activity, 150 MB at 400,000 activities)
    base = limit = 0
    launch: list[int] = []
    latency = gap = prev = dur = match = transfer = after = after_gap = gpu_launch = launch
    factor: list[float] | None = None
    start = [0] * n
    end = [0] * n
    prefix_max = [_NEG] * (n + 1)  # the latest end among the first k activities launched
    m = len(syncs)
    at_start, at_end = clock(syncs.start).tolist(), clock(syncs.end).tolist()
    launched, sync_end_measured = syncs.launched.tolist(), syncs.end.tolist()
    wakes = syncs.wakes.tolist()
    sync_start = [0] * m
    sync_end = [0] * m
    delta = [0] * m  # replayed less clocked time of each synchronization
    shift = 0  # the deltas of the synchronizations over so far
    applied = 0  # synchronizations whose delta is in `shift`: computed ones, over by the current instant
    computed = 0
    sync_starts = syncs.start.tolist()
    awaited, sync_stream, own = syncs.awaits.tolist(), syncs.stream.tolist(), syncs.own.tolist()
    coupled_run = coupled is not None
    top = _NEG  # the latest end among the activities launched so far (prefix_max's last value)
    i = 0
    for j in range(m + 1):
        until = launched[j] if j < m else n
        while i < until:
            if i >= limit:
                base, limit = i, min(i + _CHUNK, n)
                part = slice(base, limit)
                launch, gpu_launch = clocked[part].tolist(), gpu.launch[part].tolist()
                latency, gap, dur = gpu.latency[part].tolist(), gpu.gap[part].tolist(), gpu.dur[part].tolist()
                prev, after, after_gap = (
                    gpu.prev[part].tolist(),
                    gpu.after[part].tolist(),
                    gpu.after_gap[part].tolist(),
                )
                factor = scaling.gpu[part].tolist() if scaling.gpu is not None else None
                if coupled is not None:
                    match, transfer = coupled.match[part].tolist(), coupled.transfer[part].tolist()
            k = i - base
            while applied < computed and sync_end_measured[applied] <= gpu_launch[k]:
                shift += delta[applied]
                applied += 1
            t = launch[k] + shift + latency[k]
            p = prev[k]
            if p >= 0 and end[p] + gap[k] > t:
                t = end[p] + gap[k]
            a = after[k]
            if a >= 0 and end[a] + after_gap[k] > t:
                t = end[a] + after_gap[k]
            start[i] = t
            if coupled_run and match[k] >= 0 and (factor is None or factor[k]):
                # a collective: done once the last rank arrived and the transfer after it took its time
                # (removed, factor 0: it neither waits nor is waited for)
                last = yield match[k], t
                d = max(last - t, 0) + (transfer[k] if factor is None else round(transfer[k] * factor[k]))
            else:
                d = dur[k] if factor is None else round(dur[k] * factor[k])
            t += d
            end[i] = t
            # work a what-if removes (factor 0) is not waited for
            if t > top and (factor is None or factor[k]):
                top = t
            prefix_max[i + 1] = top
            i += 1
        if j == m:
            break
        while applied < computed and sync_end_measured[applied] <= sync_starts[j]:
            shift += delta[applied]
            applied += 1
        s = at_start[j] + shift
        awaits = awaited[j]
        if awaits < 0:
            ready = s
        elif sync_stream[j] == -1:
            ready = max(s, prefix_max[until])
        else:
            ready = max(s, end[awaits])
        took = ready - s + (own[j] if ready > s or not wakes[j] else 0)
        if scaling.sync != 1.0:
            took = round(took * scaling.sync)
        sync_start[j], sync_end[j] = s, s + took
        delta[j] = took - (at_end[j] - at_start[j])
        computed = j + 1
    deltas = np.cumsum(np.array(delta, dtype=np.int64))
    return Replay(
        graph,
        np.array(start, dtype=np.int64),
        np.array(end, dtype=np.int64),
        np.array(sync_start, dtype=np.int64),
        np.array(sync_end, dtype=np.int64),
        _host(graph, clock, deltas, graph.step_start),
        _host(graph, clock, deltas, graph.step_end),
        clock,
    )


def _host(graph: RankGraph, clock: _HostClock, deltas: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Host instants `t` in the replay: clocked, plus the deltas of the synchronizations over by then."""
    k = np.searchsorted(graph.syncs.end, t, side="right")  # synchronizations over by t
    before = np.where(k > 0, deltas[np.maximum(k, 1) - 1], 0) if len(graph.syncs) else 0
    return clock(t) + before


def _by_stream(
    graph: RankGraph, clock: _HostClock, scaling: Scaling
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """replay_steps' loop (without coupled collectives) in numpy, where no activity waits on another stream and
    each activity's `prev` is the one before it on its stream: between two synchronizations, each stream's
    end_j = max(ready_j + d_j, end_(j-1) + gap_j + d_j) is a running maximum once the cumulative gaps and
    durations are taken out (integers: exactly the loop's values). The host instants the loop visits (launches,
    synchronizations' starts) must come in order, so that the synchronizations applied by an instant are the
    leading ones over by then. Gives the activities' starts and ends, the synchronizations' starts and ends
    and the cumulative deltas; None where any of that does not hold, or where the pieces would be too many."""
    gpu, syncs = graph.gpu, graph.syncs
    n, m = len(gpu), len(syncs)
    if n == 0 or (gpu.after >= 0).any():
        return None
    stream = gpu.stream
    n_streams = int(stream.max()) + 1
    order = np.argsort(stream, kind="stable")
    first = np.ones(n, dtype=bool)
    first[1:] = stream[order][1:] != stream[order][:-1]
    if not np.array_equal(gpu.prev[order], np.where(first, -1, np.concatenate(([-1], order[:-1])))):
        return None
    launched = syncs.launched
    if m:
        instants = np.insert(gpu.launch, launched, syncs.start)  # in the loop's order
        awaits = syncs.awaits
        if (
            (m + 1) * n_streams > max(n // 16, 8)
            or (np.diff(launched) < 0).any()
            or launched[-1] > n
            or (np.diff(instants) < 0).any()
            or ((awaits >= 0) & (awaits >= launched)).any()
        ):
            return None
    factor = scaling.gpu
    dur = gpu.dur if factor is None else np.rint(gpu.dur * factor).astype(np.int64)
    step = gpu.gap + dur
    ready = clock(gpu.launch) + gpu.latency
    lead = np.maximum.accumulate(syncs.end) if m else syncs.end  # measured ends, as the loop applies them
    at_start, at_end = clock(syncs.start), clock(syncs.end)
    start, end = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    sync_start, sync_end = np.empty(m, dtype=np.int64), np.empty(m, dtype=np.int64)
    shift = np.zeros(m + 1, dtype=np.int64)  # the deltas of the first k synchronizations
    top = _NEG  # the latest end among the activities launched so far (removed ones left out)
    lo = 0
    for j in range(m + 1):
        hi = int(launched[j]) if j < m else n
        if hi > lo:
            applied = np.minimum(np.searchsorted(lead, gpu.launch[lo:hi], side="right"), j)
            seg_ready = ready[lo:hi] + shift[applied]
            seg_order = np.argsort(stream[lo:hi], kind="stable")
            seg_streams = stream[lo:hi][seg_order]
            bounds = [*np.flatnonzero(np.diff(seg_streams)).tolist(), len(seg_order) - 1]
            b0 = 0
            for b1 in bounds:
                rows = seg_order[b0 : b1 + 1] + lo
                cum = np.cumsum(step[rows])
                run = np.maximum.accumulate(seg_ready[rows - lo] + dur[rows] - cum)
                p = int(gpu.prev[rows[0]])
                end[rows] = (np.maximum(run, end[p]) if p >= 0 else run) + cum
                b0 = b1 + 1
            start[lo:hi] = end[lo:hi] - dur[lo:hi]
            kept = end[lo:hi] if factor is None else end[lo:hi][factor[lo:hi] != 0]
            if len(kept):
                top = max(top, int(kept.max()))
            lo = hi
        if j == m:
            break
        s = int(at_start[j]) + int(shift[min(int(np.searchsorted(lead, syncs.start[j], side="right")), j)])
        a = int(syncs.awaits[j])
        if a < 0:
            ready_at = s
        elif syncs.stream[j] == -1:
            ready_at = max(s, top)
        else:
            ready_at = max(s, int(end[a]))
        took = ready_at - s + (int(syncs.own[j]) if ready_at > s or not syncs.wakes[j] else 0)
        if scaling.sync != 1.0:
            took = round(took * scaling.sync)
        sync_start[j], sync_end[j] = s, s + took
        shift[j + 1] = shift[j] + took - (int(at_end[j]) - int(at_start[j]))
    return start, end, sync_start, sync_end, shift[1:]
