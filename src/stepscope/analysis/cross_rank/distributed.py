"""Across ranks: match collective instances, align the ranks' clocks, split collective time into waiting for peers
and transfer, and name the straggler (the rank the others wait for, see straggler.py) with its own cause.

The rules (documented in docs/analysis.md, "Across ranks"):

- **Matching.** An instance is assigned to the profiler step during which its rank issued it. Instances are
  matched across ranks by (process group, step, position among the rank's instances of that group in that
  step); torch 2.13 traces carry no collective sequence number. Point-to-point transfers (send, recv) pair a
  rank with one peer, which the traces do not name, and are not matched. A (group, step) whose ranks hold different
  numbers of instances, or different kinds at one position, is left unmatched and counted.
- **Clocks.** Every rank of a collective leaves it at nearly the same moment, so the offset of a rank's clock
  against the reference rank (the lowest) is the median of (its end - the reference's end) over the instances
  they share; ranks that share none with the reference are reached through ranks that do, in any group (the
  end of an aligned rank's instance plus that rank's offset). Without any
  match the raw clocks are used, with a notice. Matches whose ends still lie far apart after alignment
  (median beyond MATCH_MAX_SPREAD_MS and MATCH_MAX_SPREAD_SHARE of the median duration) are not the same
  collectives: they are all dropped, with a notice.
- **Groups.** Instances of different process groups are never the same collective: matching is within a
  group. Where the traces name no group (`unknown`), the unknown instances of all ranks are matched together;
  those that match take the group of the ranks they match on (`matched ranks`) only where no other group
  could hold them: a job of two ranks, both loaded (any group of two ranks or more is then {0, 1}). Otherwise
  they stay unknown.
- **Wait and transfer.** After alignment, an instance's arrival on a rank is its start there; the rank waits
  from its arrival until the last rank arrives (at most its whole duration); the rest is transfer. A rank's
  collective time and waiting are unions in time (DDP's buckets run concurrently on gloo's threads: two
  60 ms waits at once are 60 ms of waiting), inside its steps, so neither exceeds the step.
- **Stragglers.** Per process group, the ranks the group's other members wait for, from their waits at the
  group's instances each arrives last at, and whether each is late beyond the jitter of the arrival order
  (lateness.py) and its lateness its own or passed on from another group; the job's straggler is the largest of
  those whose lateness is their own (straggler.py).
"""

from __future__ import annotations

import msgspec
import numpy as np

from stepscope.analysis import intervals as iv
from stepscope.analysis.codes import unique_inverse
from stepscope.analysis.cross_rank.lateness import Arrivals
from stepscope.analysis.cross_rank.straggler import (
    GroupKey,
    GroupStraggler,
    GroupWaiting,
    Held,
    Straggler,
    group_stragglers,
    job_straggler,
)
from stepscope.analysis.per_rank.comm.collectives import (
    Instances,
    communication_intervals,
    wait_intervals,
)
from stepscope.analysis.per_rank.comm.exposed import communication_category, exposed_communication
from stepscope.analysis.per_rank.comm_names import cpu_collective
from stepscope.analysis.per_rank.prepare import RankData, RankDigest
from stepscope.analysis.per_rank.steps import STEP_RE, StepRow, pct
from stepscope.analysis.per_rank.summary import CPU_OP_CATEGORIES, self_times
from stepscope.analysis.stats import median, quantile
from stepscope.units import list_ranks

# Matched instances must end together after alignment: median spread within this many ms, or this share of
# the median duration of the instances (else the "matches" are different collectives and are dropped)
MATCH_MAX_SPREAD_MS = 5.0
MATCH_MAX_SPREAD_SHARE = 0.5
# Point-to-point kinds pair a rank with one peer, not a group: they are not matched across the group.
P2P_KINDS = frozenset({"send", "recv", "send_recv"})


class RankClock(msgspec.Struct):
    rank: int
    offset_us: float  # subtract from the rank's trace times to get the reference rank's clock
    instances: int  # matched instances the offset rests on (0: not aligned)


class ClockAlignment(msgspec.Struct):
    """How the ranks' clocks were aligned and how well the matched collectives then agree."""

    method: str  # "collectives" | "raw" (nothing matched) | "rejected" (matches that do not end together)
    reference_rank: int
    ranks: list[RankClock]
    matched: int  # collective instances matched across ranks
    unmatched: int  # timed instances left unmatched (a group/step with different counts or kinds)
    end_spread_p50_us: float | None  # per matched instance: latest end - earliest end, after alignment
    end_spread_p90_us: float | None
    end_spread_max_us: float | None


class RankCommStat(msgspec.Struct):
    rank: int
    steps: int
    step_us: float | None  # mean step time over the window
    comm_us: (
        float | None
    )  # time in collectives per step, a union inside the steps (null: no timed collective)
    comm_wait_us: float | None  # of it, waiting for peers, a union (null: not matched)
    transfer_us: float | None  # comm_us - comm_wait_us
    last_arrivals: int  # matched instances at which this rank arrived last


class CrossRank(msgspec.Struct):
    """Step time, collective time and waiting of every rank; the slowest rank and by how much."""

    ranks: list[RankCommStat]
    slowest_rank: int | None
    fastest_rank: int | None
    slowest_step_us: float | None
    fastest_step_us: float | None
    spread_us: float | None  # slowest - fastest mean step time
    spread_pct: float | None  # of the fastest
    alignment: ClockAlignment | None


# Records of arrays: compared and printed by identity (a field-wise == of arrays raises, and their repr
# would print the arrays); generating __eq__ and __repr__ cost ~0.15 ms of every start.
class Matching(msgspec.Struct, eq=False):
    """Matched instances: per match, the ranks and each rank's instance index; the step and group."""

    ranks: list[np.ndarray]
    index: list[np.ndarray]
    step: list[int]
    unmatched: int
    group: list[str] = msgspec.field(default_factory=list)  # per match, its process group's name ("" unknown)


class Distributed(msgspec.Struct, eq=False):
    """Everything the cross-rank pass computes."""

    alignment: ClockAlignment | None
    offsets_ns: dict[int, int]
    wait_ns: dict[int, np.ndarray]  # per rank, per instance (-1: not matched)
    cross: CrossRank | None
    straggler: Straggler | None
    notices: list[str]
    match: Matching
    stragglers: list[GroupStraggler] = msgspec.field(default_factory=list)  # per process group
    waiting: list[GroupWaiting] = msgspec.field(default_factory=list)  # per process group, with its verdict


def match_instances(
    instances: dict[int, Instances], steps: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]
) -> Matching:
    """Match the timed instances of the ranks (see the module doc). `steps`: rank -> (number, start, end)."""
    cells: dict[tuple[str, int], dict[int, list[int]]] = {}
    for rank, inst in instances.items():
        if not inst.timed or not len(inst) or rank not in steps:
            continue
        number, start, end = steps[rank]
        at = np.searchsorted(start, inst.issue, side="right") - 1
        ok = (at >= 0) & (inst.issue < end[np.maximum(at, 0)])
        for i in np.argsort(inst.issue, kind="stable").tolist():
            if ok[i] and inst.kind[i] not in P2P_KINDS:
                cells.setdefault((inst.group[i], int(number[at[i]])), {}).setdefault(rank, []).append(i)
    match = Matching([], [], [], 0)
    for (group, step), by_rank in sorted(cells.items(), key=lambda c: (c[0][1], c[0][0])):
        if len(by_rank) < 2:
            continue
        lists = list(by_rank.values())
        ranks = np.array(list(by_rank), dtype=np.int64)
        same_count = len({len(v) for v in lists}) == 1
        same_kinds = same_count and all(
            len({instances[r].kind[v[k]] for r, v in by_rank.items()}) == 1 for k in range(len(lists[0]))
        )
        if not same_kinds:
            match.unmatched += sum(len(v) for v in lists)
            continue
        for k in range(len(lists[0])):
            match.ranks.append(ranks)
            match.index.append(np.array([v[k] for v in lists], dtype=np.int64))
            match.step.append(step)
            match.group.append(group)
    return match


def clock_offsets(instances: dict[int, Instances], match: Matching) -> tuple[dict[int, int], dict[int, int]]:
    """Per rank, the offset of its clock against the lowest rank (ns) and the instances it rests on."""
    ranks = sorted(instances)
    offsets = {ranks[0]: 0}
    support = {ranks[0]: 0}
    # each match as {rank: its instance}, built once (not once per rank: quadratic in ranks)
    matches = [
        dict(zip(rs.tolist(), ix.tolist(), strict=True))
        for rs, ix in zip(match.ranks, match.index, strict=True)
    ]
    progress = True
    while progress and len(offsets) < len(ranks):
        progress = False
        for rank in ranks:
            if rank in offsets:
                continue
            diffs = []
            for where in matches:
                if rank not in where:
                    continue
                known = next((r for r in where if r in offsets), None)
                if known is None:
                    continue
                # aligned ends agree: end_rank - offset_rank = end_known - offset_known
                diffs.append(
                    int(instances[rank].end[where[rank]])
                    - int(instances[known].end[where[known]])
                    + offsets[known]
                )
            if diffs:
                offsets[rank] = int(median(diffs))
                support[rank] = len(diffs)
                progress = True
    for rank in ranks:
        offsets.setdefault(rank, 0)
        support.setdefault(rank, 0)
    support[ranks[0]] = max(support.values(), default=0) if len(ranks) > 1 else 0
    return offsets, support


def cross_rank_analysis(
    data: dict[int, RankDigest],
    instances: dict[int, Instances],
    step_rows: dict[int, list[StepRow]],
) -> Distributed:
    """Match, align, split wait/transfer and find the straggler; an empty result for fewer than two ranks."""
    wait_ns = {r: np.full(len(inst), -1, dtype=np.int64) for r, inst in instances.items()}
    if len(data) < 2:
        return Distributed(None, {r: 0 for r in data}, wait_ns, None, None, [], Matching([], [], [], 0))
    notices: list[str] = []
    steps = {r: (d.steps.number, d.steps.start, d.steps.end) for r, d in data.items()}
    match = match_instances(instances, steps)
    offsets, support = clock_offsets(instances, match)
    ranks = sorted(data)
    trusted, spread_ms = _ends_agree(instances, match, offsets)
    if not trusted:
        notices.append(
            f"the collectives matched across ranks do not end together ({spread_ms:.1f} ms apart, median, after "
            "alignment): they are not the same collectives (process groups the traces do not name?); raw "
            "clocks, no waiting or straggler"
        )
        match = Matching([], [], [], match.unmatched + len(match.ranks), [])
        offsets = {r: 0 for r in offsets}
        support = {r: 0 for r in support}
    if not match.ranks and not trusted:
        method = "rejected"
    elif not match.ranks:
        method = "raw"
        timed = [inst for inst in instances.values() if inst.timed and len(inst)]
        if timed and all(set(inst.kind) <= {"send", "recv"} for inst in timed):
            notices.append(
                "the ranks issue point-to-point ops only, no collective to match across ranks: raw trace clocks "
                "are used (a pipeline's waiting is its bubble, in the pipeline view)"
            )
        elif timed:
            notices.append("no collective could be matched across ranks: raw trace clocks are used")
        else:
            notices.append("no timed collective in the traces: ranks are compared on raw trace clocks")
    else:
        method = "collectives"
        lost = [r for r in ranks[1:] if support[r] == 0]
        if lost:
            notices.append(
                f"ranks {_list(lost)} share no matched collective with the others: raw clocks used"
            )
    world = {d.world_size for d in data.values()} - {None}
    if len(world) == 1 and (size := next(iter(world))) is not None and size > len(ranks):
        notices.append(
            f"{len(ranks)} of {size} ranks loaded: waiting and the straggler are judged among these ranks only"
        )
    if trusted and len(world) == 1 and next(iter(world)) == 2 == len(ranks):
        _matched_ranks_group(instances, match)
    if match.unmatched:
        notices.append(
            f"{match.unmatched} collective instances could not be matched across ranks (a process group "
            "whose ranks issued different collectives in a step)"
        )
    last_count = {r: 0 for r in ranks}
    # per group: (the rank last in, step) -> each other rank's waits, aligned, at the instances it was last in
    held: dict[str, Held] = {}
    arrivals: dict[str, Arrivals] = {}  # per group, in time order: who arrived last, the delay it charged
    spreads = []
    for rs, ix, step, group in zip(match.ranks, match.index, match.step, match.group, strict=True):
        rlist = rs.tolist()
        off = np.array([offsets[r] for r in rlist], dtype=np.int64)
        start = np.array([instances[r].start[i] for r, i in zip(rlist, ix.tolist(), strict=True)]) - off
        end = np.array([instances[r].end[i] for r, i in zip(rlist, ix.tolist(), strict=True)]) - off
        spreads.append(int(end.max() - end.min()))
        last = int(start.max())
        waits = np.clip(last - start, 0, end - start - 0)
        for r, i, w in zip(rlist, ix.tolist(), waits.tolist(), strict=True):
            wait_ns[r][i] = w
        latest_at = int(np.argmax(start))
        latest = rlist[latest_at]
        last_count[latest] += 1
        others = held.setdefault(group, {}).setdefault((latest, step), {})
        for k, (r, w) in enumerate(zip(rlist, waits.tolist(), strict=True)):
            if k != latest_at:
                others.setdefault(r, []).append((int(start[k]), int(start[k]) + w))
        arrivals.setdefault(group, Arrivals()).add(
            latest, float(waits.sum()) / (len(rlist) - 1), len(rlist), int(step)
        )
    alignment = ClockAlignment(
        method=method,
        reference_rank=ranks[0],
        ranks=[RankClock(r, round(offsets[r] / 1e3, 3), support[r]) for r in ranks],
        matched=len(match.ranks),
        unmatched=match.unmatched,
        end_spread_p50_us=round(median(spreads) / 1e3, 3) if spreads else None,
        end_spread_p90_us=round(quantile(spreads, 0.9) / 1e3, 3) if spreads else None,
        end_spread_max_us=round(max(spreads) / 1e3, 3) if spreads else None,
    )
    cross = _cross_table(data, instances, step_rows, wait_ns, last_count, alignment)
    busy_ms = {  # each rank's step less its waiting: the straggler's cause when no region or op is
        s.rank: (s.step_us - (s.comm_wait_us or 0.0)) / 1e3 for s in cross.ranks if s.step_us is not None
    }
    groups, group_steps = _matched_groups(instances, match)
    stragglers, waiting = group_stragglers(data, step_rows, held, groups, group_steps, busy_ms, arrivals)
    return Distributed(
        alignment, offsets, wait_ns, cross, job_straggler(stragglers), notices, match, stragglers, waiting
    )


def _matched_groups(
    instances: dict[int, Instances], match: Matching
) -> tuple[dict[str, GroupKey], dict[str, list[int]]]:
    """Per group name with matched instances: what is known of it (from its first matched instance; its ranks,
    else the ranks matched) and its matched steps, sorted."""
    groups: dict[str, GroupKey] = {}
    matched: dict[str, set[int]] = {}
    steps: dict[str, set[int]] = {}
    for rs, ix, step, group in zip(match.ranks, match.index, match.step, match.group, strict=True):
        matched.setdefault(group, set()).update(rs.tolist())
        steps.setdefault(group, set()).add(step)
        if group not in groups:
            inst, i = instances[int(rs[0])], int(ix[0])
            known = inst.group_ranks[i]
            groups[group] = GroupKey(group, inst.dim[i], tuple(known) if known else (), inst.group_source[i])
    for group, key in groups.items():
        if not key.ranks:
            groups[group] = GroupKey(key.group, key.dim, tuple(sorted(matched[group])), key.group_source)
    return groups, {g: sorted(s) for g, s in steps.items()}


def _ends_agree(
    instances: dict[int, Instances], match: Matching, offsets: dict[int, int]
) -> tuple[bool, float]:
    """Whether the matched instances end together after alignment (median spread within MATCH_MAX_SPREAD_MS
    or MATCH_MAX_SPREAD_SHARE of the median duration); and that median spread in ms."""
    if not match.ranks:
        return True, 0.0
    spreads = []
    durations = []
    for rs, ix in zip(match.ranks, match.index, strict=True):
        ends = [int(instances[r].end[i]) - offsets[r] for r, i in zip(rs.tolist(), ix.tolist(), strict=True)]
        spreads.append(max(ends) - min(ends))
        durations += [
            int(instances[r].end[i] - instances[r].start[i])
            for r, i in zip(rs.tolist(), ix.tolist(), strict=True)
        ]
    spread = quantile(spreads, 0.5)
    limit = max(MATCH_MAX_SPREAD_MS * 1e6, MATCH_MAX_SPREAD_SHARE * quantile(durations, 0.5))
    return spread <= limit, spread / 1e6


def _matched_ranks_group(instances: dict[int, Instances], match: Matching) -> None:
    """Rule `matched ranks` (module doc): unknown instances matched on both ranks of a two-rank job."""
    for rs, ix in zip(match.ranks, match.index, strict=True):
        ranks = tuple(sorted(rs.tolist()))
        for r, i in zip(rs.tolist(), ix.tolist(), strict=True):
            inst = instances[r]
            if inst.group_source[i] == "unknown":
                inst.group_ranks[i], inst.group_source[i] = ranks, "matched ranks"


def _list(values: list[int]) -> str:
    return list_ranks(values)


def _cross_table(
    data: dict[int, RankDigest],
    instances: dict[int, Instances],
    step_rows: dict[int, list[StepRow]],
    wait_ns: dict[int, np.ndarray],
    last_count: dict[int, int],
    alignment: ClockAlignment,
) -> CrossRank:
    stats = []
    for rank in sorted(data):
        rows = step_rows.get(rank, [])
        n = len(rows)
        inst = instances.get(rank)
        summary = data[rank]
        step_us = round(sum(r.dur_us for r in rows) / n, 3) if n else None
        comm_us = wait_us = transfer_us = None
        if summary.comm is not None and n:
            # unions inside the steps: concurrent collectives count once, and nothing exceeds the step
            lo, hi = summary.steps.start, summary.steps.end
            comm_ns = int(iv.covered_within(summary.comm, lo, hi).sum())
            comm_us = round(comm_ns / 1e3 / n, 3)
            waits = wait_ns[rank]
            if inst is not None and (waits >= 0).any():
                waiting = iv.intersect(wait_intervals(inst, waits), summary.comm)
                wait_total = int(iv.covered_within(waiting, lo, hi).sum())
                wait_us = round(wait_total / 1e3 / n, 3)
                transfer_us = round((comm_ns - wait_total) / 1e3 / n, 3)
        stats.append(RankCommStat(rank, n, step_us, comm_us, wait_us, transfer_us, last_count.get(rank, 0)))
    timed = [s for s in stats if s.step_us is not None]
    if not timed:
        return CrossRank(stats, None, None, None, None, None, None, alignment)
    slow = max(timed, key=lambda s: (s.step_us, -s.rank))
    fast = min(timed, key=lambda s: (s.step_us, s.rank))
    assert slow.step_us is not None and fast.step_us is not None
    return CrossRank(
        ranks=stats,
        slowest_rank=slow.rank,
        fastest_rank=fast.rank,
        slowest_step_us=slow.step_us,
        fastest_step_us=fast.step_us,
        spread_us=round(slow.step_us - fast.step_us, 3),
        spread_pct=pct(slow.step_us - fast.step_us, fast.step_us),
        alignment=alignment,
    )


def summarize_rank(data: RankData, *, ops: bool = True) -> RankDigest:
    """The cross-rank inputs of one prepared rank: its steps, its time in communication (`ops`: with the CPU
    ops' self time per step, which only the straggler's cause needs)."""
    info = data.table.ranks.get(data.rank)
    summary = RankDigest(data.rank, data.lo, data.hi, data.steps, info.world_size if info else None)
    summary.comm = communication_intervals(data)
    if summary.comm is not None:
        summary.comm_exposed = communication_category(data, summary.comm)
        summary.comm_shown = (
            summary.comm_exposed if len(data.gpu_all) else exposed_communication(data, summary.comm)
        )
    n = len(data.steps)
    if not ops or n == 0:
        return summary
    table = data.table
    selfs = self_times(table)
    ts = table.columns["ts"]
    rows = np.flatnonzero(
        (ts >= int(data.steps.start[0]))
        & (ts < int(data.steps.end[-1]))
        & table.cat_mask(*CPU_OP_CATEGORIES)
        & (selfs > 0)
    )
    codes = table.columns["name"][rows]
    kept = [
        code
        for code in unique_inverse(codes)[0].tolist()
        if not (STEP_RE.match(name := table.names[code]) or cpu_collective(name) or "wait" in name.lower())
    ]
    index = np.full(len(table.names) + 1, -1, dtype=np.int32)
    index[kept] = np.arange(len(kept))
    op = index[codes]
    del codes
    use = np.flatnonzero(op >= 0)
    rows, op = rows[use], op[use]
    del use
    start = ts[rows]
    step = np.searchsorted(data.steps.start, start, side="right") - 1  # the step started last
    gap = start >= data.steps.end[step]
    del start
    value = selfs[rows]
    inside = np.zeros((len(kept), n), dtype=np.int64)
    between = np.zeros((len(kept), n), dtype=np.int64)
    np.add.at(inside, (op[~gap], step[~gap]), value[~gap])
    np.add.at(between, (op[gap], step[gap]), value[gap])
    summary.op_names = [table.names[c] for c in kept]
    summary.op_inside, summary.op_gap = inside, between
    return summary


def aligned_matches(
    instances: dict[int, Instances], steps: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]
) -> tuple[Matching, dict[int, int]]:
    """The matched instances and the ranks' clock offsets (ns), by the rules of cross_rank_analysis; no match
    where the matched instances do not end together. `steps`: rank -> (number, start, end)."""
    match = match_instances(instances, steps)
    offsets, _ = clock_offsets(instances, match)
    if not _ends_agree(instances, match, offsets)[0]:
        return Matching([], [], [], match.unmatched + len(match.ranks)), {r: 0 for r in offsets}
    return match, offsets
