"""Communication per step by parallel dimension, per rank and for the job: how long each dimension's collectives
take per step, how many there are, their bytes, and how much of their time is exposed (the step waits on it).

A collective's dimension is its group's (per_rank/comm/groups.py): the mesh dimension the job named (dp, tp, ...),
else the group's description (default_pg, the job's own), else "unknown". Per rank, a dimension's time is the
union in time of its instances inside the analysed steps (concurrent collectives count once), divided by the
steps; its exposed time is the part of that union the rank's exposed communication covers
(collectives.exposed_communication: communication that no other activity of the rank overlaps). The job's row
of a dimension is the mean over the ranks that have it, with the rank that exposes it most; a rank's row names
the ranks of its groups of that dimension and, of those analysed, the one that exposes it most.
"""

from __future__ import annotations

import msgspec
import numpy as np

from stepscope.analysis import intervals as iv
from stepscope.analysis.per_rank.comm.collectives import Instances
from stepscope.analysis.per_rank.prepare import RankDigest

UNKNOWN_DIM = "unknown"


class DimensionStats(msgspec.Struct):
    """One dimension's collectives on one rank (or, in `job`, averaged over the ranks that have it)."""

    dim: str  # mesh dimension, else the group's description, else "unknown"
    groups: list[str]  # process-group names of its instances ("" is none: unknown)
    count: int  # instances over the analysed steps (job: summed over the ranks)
    count_per_step: float
    bytes: int | None  # input messages summed (job: over the ranks); null when an instance lacks a size
    time_ms_per_step: float | None  # union of its instances inside the steps, per step; null: untimed
    exposed_ms_per_step: float | None  # of it, exposed; null: untimed or the rank's exposure unknown
    exposed_pct: float | None  # exposed share of its time
    step_pct: float | None  # its time, share of the mean step
    # job rows: the ranks that have the dimension; a rank's rows: the ranks of its groups of the dimension (its
    # peers and itself; empty where no group's ranks are known)
    ranks: list[int] = []
    # of those ranks, the analysed one where the dimension is most exposed (its exposed time per step)
    most_exposed_rank: int | None = None


class RankDimensions(msgspec.Struct):
    rank: int
    steps: int
    dims: list[DimensionStats]


class Dimensions(msgspec.Struct):
    """`analyze --json`'s `dimensions`: per rank and for the job, largest time first."""

    ranks: list[RankDimensions]
    job: list[DimensionStats]


def dimension_of(inst: Instances, i: int) -> str:
    return inst.dim[i] or inst.group_desc[i] or UNKNOWN_DIM


def rank_dimensions(
    inst: Instances, digest: RankDigest, seen: dict[tuple[int, ...], list[int]] | None = None
) -> RankDimensions:
    """The dimensions of one rank's instances over its analysed steps. `seen`: the rank lists already made
    (a rank list of many ranks' rows is made once and shared: a job of N ranks in one group has N rows of N)."""
    seen = {} if seen is None else seen
    steps = digest.steps
    n = len(steps.start)
    by_dim: dict[str, list[int]] = {}
    for i in range(len(inst)):
        by_dim.setdefault(dimension_of(inst, i), []).append(i)
    mean_step = float((steps.end - steps.start).sum()) / n if n else 0.0
    rows = []
    for dim, idx in by_dim.items():
        ix = np.array(idx, dtype=np.int64)
        sizes = inst.in_bytes[ix]
        time_ms = exposed_ms = exposed_pct = step_pct = None
        if inst.timed and n:
            union = iv.merge(inst.start[ix], inst.end[ix])
            time_ns = int(iv.covered_within(union, steps.start, steps.end).sum())
            time_ms = round(time_ns / 1e6 / n, 6)
            step_pct = round(100.0 * time_ns / n / mean_step, 2) if mean_step else None
            if digest.comm_shown is not None:
                exposed = iv.intersect(union, digest.comm_shown)
                exposed_ns = int(iv.covered_within(exposed, steps.start, steps.end).sum())
                exposed_ms = round(exposed_ns / 1e6 / n, 6)
                exposed_pct = round(100.0 * exposed_ns / time_ns, 2) if time_ns else None
        rows.append(
            DimensionStats(
                dim=dim,
                groups=sorted({inst.group[i] for i in idx}),
                count=len(idx),
                count_per_step=round(len(idx) / n, 3) if n else float(len(idx)),
                bytes=int(sizes.sum()) if (sizes >= 0).all() else None,
                time_ms_per_step=time_ms,
                exposed_ms_per_step=exposed_ms,
                exposed_pct=exposed_pct,
                step_pct=step_pct,
                ranks=_group_ranks(inst, idx, seen),
            )
        )
    return RankDimensions(inst.rank, n, _ordered(rows))


def job_dimensions(per_rank: list[RankDimensions]) -> list[DimensionStats]:
    """Each dimension over the ranks that have it: counts and bytes summed, times averaged."""
    found: dict[str, list[tuple[int, DimensionStats]]] = {}
    for rank in per_rank:
        for row in rank.dims:
            found.setdefault(row.dim, []).append((rank.rank, row))
    rows = []
    for dim, of_ranks in found.items():
        stats = [s for _, s in of_ranks]
        sizes = [s.bytes for s in stats]
        time = _mean([s.time_ms_per_step for s in stats])
        exposed = _mean([s.exposed_ms_per_step for s in stats])
        rows.append(
            DimensionStats(
                dim=dim,
                groups=sorted({g for s in stats for g in s.groups}),
                count=sum(s.count for s in stats),
                count_per_step=round(sum(s.count_per_step for s in stats), 3),
                bytes=None if any(b is None for b in sizes) else sum(b for b in sizes if b is not None),
                time_ms_per_step=time,
                exposed_ms_per_step=exposed,
                exposed_pct=round(100.0 * exposed / time, 2) if time and exposed is not None else None,
                step_pct=_mean([s.step_pct for s in stats], 2),
                ranks=[r for r, _ in of_ranks],
                most_exposed_rank=_most_exposed([(s.exposed_ms_per_step, r) for r, s in of_ranks]),
            )
        )
    return _ordered(rows)


def dimensions(instances: dict[int, Instances], digests: dict[int, RankDigest]) -> Dimensions | None:
    """Per rank and for the job; None when no rank has a collective."""
    seen: dict[tuple[int, ...], list[int]] = {}
    per_rank = [
        rank_dimensions(instances[r], digests[r], seen) for r in sorted(instances) if len(instances[r])
    ]
    if not per_rank:
        return None
    exposed = {(r.rank, d.dim): d.exposed_ms_per_step for r in per_rank for d in r.dims}
    most: dict[tuple[str, int], int | None] = {}  # by dimension and rank list (shared lists: their id)
    for r in per_rank:
        for d in r.dims:
            key = (d.dim, id(d.ranks))
            if key not in most:
                most[key] = _most_exposed([(exposed.get((peer, d.dim)), peer) for peer in d.ranks])
            d.most_exposed_rank = most[key]
    return Dimensions(per_rank, job_dimensions(per_rank))


def _group_ranks(inst: Instances, idx: list[int], seen: dict[tuple[int, ...], list[int]]) -> list[int]:
    """The ranks of the groups of instances `idx`, ascending (one list per distinct set, shared)."""
    groups = {id(g): g for i in idx if (g := inst.group_ranks[i]) is not None}
    if len(groups) == 1:
        key = tuple(next(iter(groups.values())))
    else:
        key = tuple(sorted({r for g in groups.values() for r in g}))
    ranks = seen.get(key)
    if ranks is None:
        seen[key] = ranks = sorted(set(key))
    return ranks


def _most_exposed(by_rank: list[tuple[float | None, int]]) -> int | None:
    """The rank of the largest exposed time (the lowest rank of a tie); None when none is known."""
    known = [(e, r) for e, r in by_rank if e is not None]
    return max(known, key=lambda e: (e[0], -e[1]))[1] if known else None


def _mean(values: list[float | None], digits: int = 6) -> float | None:
    known = [v for v in values if v is not None]
    return round(sum(known) / len(known), digits) if known and len(known) == len(values) else None


def _ordered(rows: list[DimensionStats]) -> list[DimensionStats]:
    return sorted(rows, key=lambda s: (-(s.time_ms_per_step or 0.0), -s.count, s.dim))
