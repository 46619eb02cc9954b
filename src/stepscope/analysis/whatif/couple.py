"""Ranks replayed together: a collective ends on every rank once the last rank has arrived at it.

The collectives matched across ranks (cross_rank/distributed.py: by process group, step and position; clocks aligned
on their ends) tie the ranks' graphs: on each rank, a matched collective is an activity (its kernel, or its CPU
backend's range) that starts when its rank gets to it (its arrival) and ends after the latest arrival of the
match's ranks plus its own transfer, as measured (its end less the latest arrival, after alignment). The ranks'
replays advance together: one waits at a collective until every rank of the match has arrived in the replay,
so a change on one rank reaches the others through the collectives they share.

Where the ranks' orders of collectives cannot be followed together (a rank waits at one collective while a peer
waits at another that the first has not reached: orders the trace does not explain, such as collectives on
different streams in different orders), the earliest-arrived waiting collective is released with the arrivals
it has; the count is a note. A collective a what-if removes (factor 0) on a rank neither waits nor is waited for
there.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator, Mapping

import msgspec
import numpy as np

from stepscope.analysis.cross_rank.distributed import aligned_matches
from stepscope.analysis.per_rank.comm.collectives import Instances
from stepscope.analysis.whatif.graph import RankGraph
from stepscope.analysis.whatif.replay import Coupled, Replay, Scaling, replay_steps


# Records of arrays: compared and printed by identity.
class Coupling(msgspec.Struct, eq=False):
    """The matched collectives of the ranks' graphs."""

    coupled: dict[int, Coupled]  # per rank
    members: list[tuple[int, ...]]  # per match, its ranks among the graphs
    offsets: dict[int, int]  # per rank, its clock against the reference rank's (ns; subtract to align)
    # per match and rank: the activity (index into the rank's GpuNodes)
    activity: list[dict[int, int]]

    def __len__(self) -> int:
        return len(self.members)


def couple(graphs: Mapping[int, RankGraph], instances: Mapping[int, Instances]) -> Coupling:
    """The collectives matched across `graphs` (see the module's doc); an empty coupling for one rank."""
    offsets = {r: 0 for r in graphs}
    coupled = {
        r: Coupled(np.full(len(g.gpu), -1, dtype=np.int64), np.zeros(len(g.gpu), dtype=np.int64))
        for r, g in graphs.items()
    }
    out = Coupling(coupled, [], offsets, [])
    if len(graphs) < 2:
        return out
    steps = {r: (g.step_number, g.step_start, g.step_end) for r, g in graphs.items()}
    match, found = aligned_matches({r: instances[r] for r in graphs}, steps)
    offsets.update(found)
    at_row = {r: {row: i for i, row in enumerate(g.gpu.row.tolist())} for r, g in graphs.items()}
    for ranks, index in zip(match.ranks, match.index, strict=True):
        where: dict[int, int] = {}
        for r, i in zip(ranks.tolist(), index.tolist(), strict=True):
            a = at_row[r].get(int(instances[r].row[i]), -1)
            if a >= 0:
                where[r] = a
        if len(where) < 2:
            continue
        arrival = {r: int(graphs[r].gpu.start[a]) - offsets[r] for r, a in where.items()}
        last = max(arrival.values())
        m = len(out.members)
        for r, a in where.items():
            g = graphs[r]
            end = int(g.gpu.start[a] + g.gpu.dur[a]) - offsets[r]
            coupled[r].match[a] = m
            coupled[r].transfer[a] = min(max(end - last, 0), int(g.gpu.dur[a]))
        out.members.append(tuple(sorted(where)))
        out.activity.append(where)
    return out


def replay_job(
    graphs: Mapping[int, RankGraph], coupling: Coupling, scalings: Mapping[int, Scaling] | None = None
) -> tuple[dict[int, Replay], int]:
    """Every rank's replay, advancing together through their matched collectives (see the module's doc); and how
    many collectives had to be released before all their ranks arrived."""
    scalings = scalings or {}
    offsets = coupling.offsets
    # a collective a what-if removes (factor 0) on a rank neither waits nor is waited for there
    size = [len(m) for m in coupling.members]
    for r, scaling in scalings.items():
        if scaling.gpu is not None and r in coupling.coupled:
            for m in (
                coupling.coupled[r].match[(coupling.coupled[r].match >= 0) & (scaling.gpu == 0)].tolist()
            ):
                size[m] -= 1
    runs: dict[int, Generator[tuple[int, int], int, Replay]] = {
        r: replay_steps(g, scalings.get(r), coupling.coupled.get(r) if len(coupling) else None)
        for r, g in graphs.items()
    }
    out: dict[int, Replay] = {}
    arrived: dict[int, dict[int, int]] = {}  # match -> rank -> arrival, aligned
    released: dict[int, int] = {}  # match -> its latest arrival, aligned (released early)
    waiting: dict[int, int] = {}  # rank -> the match it waits at
    ready: deque[tuple[int, int | None]] = deque((r, None) for r in runs)
    forced = 0
    while ready or waiting:
        while ready:
            rank, value = ready.popleft()
            try:
                m, t = runs[rank].send(value)  # type: ignore[arg-type]
            except StopIteration as done:
                out[rank] = done.value
                continue
            t -= offsets[rank]
            if m in released:
                ready.append((rank, max(released[m], t) + offsets[rank]))
                continue
            at = arrived.setdefault(m, {})
            at[rank] = t
            waiting[rank] = m
            if len(at) >= size[m]:
                last = max(at.values())
                for r in arrived.pop(m):
                    del waiting[r]
                    ready.append((r, last + offsets[r]))
        if waiting:
            forced += 1
            m = min(set(waiting.values()), key=lambda k: (max(arrived[k].values()), k))
            last = released[m] = max(arrived[m].values())
            for r in arrived.pop(m):
                del waiting[r]
                ready.append((r, last + offsets[r]))
    return out, forced
