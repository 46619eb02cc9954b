"""Re-time one rank's graph (graph.py) with its measured durations, or with some of them scaled (a what-if).

The host timeline keeps its measured time, scaled where a what-if scales host work; each synchronization takes
the time its awaited GPU work now needs; GPU activities start when their stream, their launch and what they
wait for on another stream (an event; the same CUDA graph's work) allow. One pass
in the order of the trace: a synchronization only awaits work launched before it, and an activity only follows
activities launched before it.
"""

from __future__ import annotations

import itertools
from collections.abc import Generator
from typing import Any

import msgspec
import numpy as np

from stepscope.analysis.codes import distinct_sorted
from stepscope.analysis.whatif.graph import RankGraph

_NEG = np.iinfo(np.int64).min // 4


class Scaling(msgspec.Struct):
    """What a what-if changes on one rank: host intervals (start, end, factor), a factor per GPU activity
    (index into GpuNodes), a factor for synchronizations. Factors multiply where selections overlap."""

    host: list[tuple[np.ndarray, np.ndarray, float]] = []
    gpu: np.ndarray | None = None  # float factor per GPU activity; None: all 1
    sync: float = 1.0


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
    if (
        coupled is None
        and not len(syncs)
        and (by_stream := _streams_alone(graph, clock, scaling)) is not None
    ):
        none = np.zeros(0, dtype=np.int64)
        return Replay(graph, *by_stream, none, none, clock(graph.step_start), clock(graph.step_end), clock)
    n = len(gpu)
    launch = clock(gpu.launch).tolist()
    factor = scaling.gpu.tolist() if scaling.gpu is not None else None
    latency, gap, prev, dur = gpu.latency.tolist(), gpu.gap.tolist(), gpu.prev.tolist(), gpu.dur.tolist()
    match: list[int] = coupled.match.tolist() if coupled is not None else []
    transfer: list[int] = coupled.transfer.tolist() if coupled is not None else []
    after, after_gap = gpu.after.tolist(), gpu.after_gap.tolist()
    start = [0] * n
    end = [0] * n
    prefix_max = [_NEG] * (n + 1)  # the latest end among the first k activities launched
    m = len(syncs)
    at_start, at_end = clock(syncs.start).tolist(), clock(syncs.end).tolist()
    launched, sync_end_measured = syncs.launched.tolist(), syncs.end.tolist()
    wakes = syncs.wakes.tolist()
    gpu_launch = gpu.launch.tolist()
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
            while applied < computed and sync_end_measured[applied] <= gpu_launch[i]:
                shift += delta[applied]
                applied += 1
            t = launch[i] + shift + latency[i]
            p = prev[i]
            if p >= 0 and end[p] + gap[i] > t:
                t = end[p] + gap[i]
            a = after[i]
            if a >= 0 and end[a] + after_gap[i] > t:
                t = end[a] + after_gap[i]
            start[i] = t
            if coupled_run and match[i] >= 0 and (factor is None or factor[i]):
                # a collective: done once the last rank arrived and the transfer after it took its time
                # (removed, factor 0: it neither waits nor is waited for)
                last = yield match[i], t
                d = max(last - t, 0) + (transfer[i] if factor is None else round(transfer[i] * factor[i]))
            else:
                d = dur[i] if factor is None else round(dur[i] * factor[i])
            t += d
            end[i] = t
            # work a what-if removes (factor 0) is not waited for
            if t > top and (factor is None or factor[i]):
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

    def host(t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(syncs.end, t, side="right")  # synchronizations over by t
        before = np.where(k > 0, deltas[np.maximum(k, 1) - 1], 0) if m else 0
        return clock(t) + before

    return Replay(
        graph,
        np.array(start, dtype=np.int64),
        np.array(end, dtype=np.int64),
        np.array(sync_start, dtype=np.int64),
        np.array(sync_end, dtype=np.int64),
        host(graph.step_start),
        host(graph.step_end),
        clock,
    )


def _streams_alone(
    graph: RankGraph, clock: _HostClock, scaling: Scaling
) -> tuple[np.ndarray, np.ndarray] | None:
    """replay_steps' starts and ends where nothing ties the streams (no synchronization, no coupled collective,
    no activity waiting on another stream) and each activity's `prev` is the one before it on its stream: per
    stream, end_j = max(ready_j + dur_j, end_(j-1) + gap_j + dur_j) is a running maximum once the cumulative
    gaps and durations are taken out (integers: exactly the loop's values). None where that does not hold."""
    gpu = graph.gpu
    n = len(gpu)
    if n == 0 or (gpu.after >= 0).any():
        return None
    order = np.argsort(gpu.stream, kind="stable")
    stream = gpu.stream[order]
    first = np.ones(n, dtype=bool)
    first[1:] = stream[1:] != stream[:-1]
    expected = np.where(first, -1, np.concatenate(([-1], order[:-1])))
    if not np.array_equal(gpu.prev[order], expected):
        return None
    dur = gpu.dur if scaling.gpu is None else np.rint(gpu.dur * scaling.gpu).astype(np.int64)
    ready = clock(gpu.launch) + gpu.latency
    d, step = dur[order], np.where(first, 0, gpu.gap[order] + dur[order])
    cum = np.cumsum(step)  # (over every stream: a constant within a stream cancels out of end)
    end = np.empty(n, dtype=np.int64)
    bounds = [*np.flatnonzero(first).tolist(), n]
    for lo, hi in itertools.pairwise(bounds):
        end[order[lo:hi]] = np.maximum.accumulate(ready[order[lo:hi]] + d[lo:hi] - cum[lo:hi]) + cum[lo:hi]
    return end - dur, end
