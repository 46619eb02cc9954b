"""One step's critical path as a timeline (analyze's `critical_path.timeline`; the report draws it): the
stretches of the path on each rank's host and streams, over the step's work on them, in ms from the step's
start on the job's clock (the ranks' clocks aligned by couple.py).

The step drawn is the one whose path is the median's: a typical step, not the worst. The work under the path
(`busy`) is the replay's (with nothing scaled, the trace's): the host's phases and synchronizations and each
stream's activities, by kind. Neighbouring stretches closer than a thousandth of the step are joined (and
more, past MAX_PATH_SPANS and MAX_BUSY_SPANS: _joined_path, _joined_busy), so that a step of thousands of kernels stays a chart a
browser draws at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from stepscope.analysis.per_rank.kernels import KIND_NAMES
from stepscope.analysis.whatif.graph import COMPILED_PHASE
from stepscope.analysis.whatif.path import HOST_LANE, PathStep, PathTimeline, Span, TimelineSpan, walk_step
from stepscope.analysis.whatif.replay import Replay

if TYPE_CHECKING:
    from stepscope.analysis.whatif.couple import Coupling

# past these, neighbouring stretches are joined across wider gaps (_joined_path, _joined_busy)
MAX_PATH_SPANS = 1500
MAX_BUSY_SPANS = 600


def median_step(steps: list[PathStep]) -> int:
    """The index of the step whose path length is the median's (the lower one of an even count)."""
    order = sorted(range(len(steps)), key=lambda i: (steps[i].step_ms, i))
    return order[(len(order) - 1) // 2]


def path_timeline(
    replays: Mapping[int, Replay], coupling: Coupling | None, k: int, step_ms: float, *, marked: bool = True
) -> PathTimeline:
    """The timeline of step `k` (an index into the replays' steps) of the ranks replayed together. `marked`:
    the traces mark their steps (ProfilerStep); else the window is drawn whole, as one step."""
    offsets = coupling.offsets if coupling is not None else {r: 0 for r in replays}
    spans: list[Span] = []
    _, last = walk_step(replays, coupling, k, {}, spans=spans)
    # with no collective matched, the ranks' clocks are not aligned: each is drawn from its own step's start
    aligned = coupling is not None and len(coupling) > 0
    base = {r: int(rep.step_start[k]) - offsets[r] for r, rep in replays.items()}
    if aligned:
        base = dict.fromkeys(base, min(base.values()))

    def ms(rank: int, t: int) -> float:
        return round((t - offsets[rank] - base[rank]) / 1e6, 4)

    path = []
    for s in sorted(spans, key=lambda s: (s.start - offsets[s.rank], s.rank)):
        rep = replays[s.rank]
        # a stretch before the step's start (a queue the step inherited) is not the step's
        start = max(s.start, int(rep.step_start[k]))
        if s.end > start:
            lane, name = _lane(rep, s.lane), _name(rep, s.activity)
            path.append(TimelineSpan(s.rank, lane, ms(s.rank, start), ms(s.rank, s.end), s.what, name))
    busy = [
        TimelineSpan(rank, lane, ms(rank, lo), ms(rank, hi), what)
        for rank in sorted(replays)
        for lane, lo, hi, what in _busy(replays[rank], k)
    ]
    return PathTimeline(
        step=int(replays[last].graph.step_number[k]) if marked else None,
        step_ms=step_ms,
        path=_joined_path(path, step_ms),
        busy=_joined_busy(busy, step_ms),
        aligned=aligned or len(replays) == 1,
    )


def _lane(rep: Replay, lane: int) -> str:
    if lane < 0:
        return HOST_LANE
    lanes = rep.graph.lanes
    return lanes[lane] if lane < len(lanes) else f"stream #{lane}"


def _name(rep: Replay, activity: int) -> str | None:
    if activity < 0:
        return None
    g = rep.graph
    name = g.names[int(g.gpu.name[activity])]
    graph = int(g.gpu.graph[activity])
    return f"{g.graph_names[graph]} > {name}" if graph >= 0 else name


def _busy(rep: Replay, k: int) -> list[tuple[str, int, int, str]]:
    """(lane, start, end, what) of step `k`'s work on one rank, in its replay's time: the host's phases and
    synchronizations, each stream's activities."""
    g = rep.graph
    lo, hi = int(rep.step_start[k]), int(rep.step_end[k])
    m_lo, m_hi = int(g.step_start[k]), int(g.step_end[k])
    out: list[tuple[str, int, int, str]] = []
    for phase, (start, end) in g.phases.items():
        if phase == COMPILED_PHASE:
            continue
        keep = (end > m_lo) & (start < m_hi)
        a, b = _host_time(rep, np.maximum(start[keep], m_lo)), _host_time(rep, np.minimum(end[keep], m_hi))
        out += [(HOST_LANE, x, y, f"host: {phase}") for x, y in zip(a.tolist(), b.tolist(), strict=True)]
    keep = (rep.sync_end > lo) & (rep.sync_start < hi)
    out += [
        (HOST_LANE, x, y, "sync")
        for x, y in zip(rep.sync_start[keep].tolist(), rep.sync_end[keep].tolist(), strict=True)
    ]
    # the host's time in none of them
    at = lo
    for _, x, y, _ in sorted(out, key=lambda item: item[1]):
        if x > at:
            out.append((HOST_LANE, at, min(x, hi), "host: other"))
        at = max(at, y)
    if at < hi:
        out.append((HOST_LANE, at, hi, "host: other"))
    gpu = g.gpu
    running = np.flatnonzero((rep.gpu_end > lo) & (rep.gpu_start < hi))
    out += [
        (
            _lane(rep, int(gpu.stream[i])),
            max(int(rep.gpu_start[i]), lo),
            min(int(rep.gpu_end[i]), hi),
            KIND_NAMES[int(gpu.kind[i])],
        )
        for i in running.tolist()
    ]
    return [item for item in out if item[2] > item[1]]


def _host_time(rep: Replay, t: np.ndarray) -> np.ndarray:
    """Measured host instants `t` in the replay's time: its clock, moved by what the synchronizations before
    each instant took more or less in the replay."""
    syncs = rep.graph.syncs
    out = rep.clock(t)
    if not len(syncs):
        return out
    j = np.searchsorted(syncs.end, t, side="right") - 1
    moved = rep.sync_end - rep.clock(syncs.end)
    return out + np.where(j >= 0, moved[np.maximum(j, 0)], 0)


def _joined_path(spans: list[TimelineSpan], step_ms: float) -> list[TimelineSpan]:
    """The path's stretches in time order, each joined to the one before it where both lie on one lane, of one
    kind and name, less than a thousandth of the step apart. While more than MAX_PATH_SPANS are left, the bound
    doubles and a stretch shorter than it (under a pixel of a chart of the step) joins its neighbour before it
    whatever its lane, kind or name, so that the stretches still add up to the path."""
    bound = max(step_ms, 1e-3) / 1000
    out = _join_path(spans, bound, short=0.0)
    while len(out) > MAX_PATH_SPANS:
        bound *= 2
        out = _join_path(out, bound, short=bound)
    return out


def _join_path(spans: list[TimelineSpan], bound: float, short: float) -> list[TimelineSpan]:
    out: list[TimelineSpan] = []
    for s in sorted(spans, key=lambda s: (s.start_ms, s.end_ms)):
        prev = out[-1] if out else None
        if prev is None or s.start_ms - prev.end_ms > bound:
            out.append(TimelineSpan(s.rank, s.lane, s.start_ms, s.end_ms, s.what, s.name))
            continue
        same = (prev.rank, prev.lane, prev.what, prev.name) == (s.rank, s.lane, s.what, s.name)
        if same or s.end_ms - s.start_ms < short:
            prev.end_ms = max(prev.end_ms, s.end_ms)
            prev.name = prev.name if same else None
        elif prev.end_ms - prev.start_ms < short:
            # the short one before it is absorbed into it
            out[-1] = TimelineSpan(s.rank, s.lane, prev.start_ms, max(prev.end_ms, s.end_ms), s.what)
        else:
            out.append(TimelineSpan(s.rank, s.lane, s.start_ms, s.end_ms, s.what, s.name))
    return out


def _joined_busy(spans: list[TimelineSpan], step_ms: float) -> list[TimelineSpan]:
    """The step's work in time order, each stretch joined to the one before it on its rank's lane where both are
    of one kind less than a thousandth of the step apart; while more than MAX_BUSY_SPANS are left, the bound doubles
    and stretches shorter than it are left out."""
    bound = max(step_ms, 1e-3) / 1000
    out = _join_lanes(spans, bound)
    while len(out) > MAX_BUSY_SPANS:
        bound *= 2
        out = _join_lanes([s for s in out if s.end_ms - s.start_ms >= bound], bound)
    return sorted(out, key=lambda s: (s.start_ms, s.rank, s.lane))


def _join_lanes(spans: list[TimelineSpan], bound: float) -> list[TimelineSpan]:
    out: list[TimelineSpan] = []
    for s in sorted(spans, key=lambda s: (s.rank, s.lane, s.start_ms, s.end_ms)):
        prev = out[-1] if out else None
        if (
            prev is not None
            and (prev.rank, prev.lane, prev.what) == (s.rank, s.lane, s.what)
            and s.start_ms - prev.end_ms <= bound
        ):
            prev.end_ms = max(prev.end_ms, s.end_ms)
            continue
        out.append(TimelineSpan(s.rank, s.lane, s.start_ms, s.end_ms, s.what))
    return out
