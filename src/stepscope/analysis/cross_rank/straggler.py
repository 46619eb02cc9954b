"""The stragglers: the ranks the others wait for, by how much, and each one's own cause.

In each step, the rank that arrives last at a matched collective delays every other rank by that rank's wait;
the delay a rank causes in a step is the mean over the other ranks of the union in time of their waits at the
instances it arrives last at (collectives running at once, such as DDP's buckets, wait for it once). A group's
waiting is the sum of those delays over its ranks, and each rank's share of it is its delay over that sum (the
shares add up to the waiting). Every rank that is last consistently, beyond what jitter gives (lateness.py's
test against how the arrival order changes from collective to collective), and whose delay is
STRAGGLER_MIN_PCT of the step time and STRAGGLER_MIN_DELAY_MS or more is a straggler; a group whose waiting no
rank holds consistently has "no consistent straggler". Each straggler's cause is the phase of its own step
(data loader, forward, backward, optimizer) longer than on the other ranks by at least CAUSE_MIN_SHARE of the
delay, else the op whose self time is, else the time outside annotated regions and ops (its step less its
waiting, against the others'). The matching and the waits themselves are distributed.py's.

Per process group: the same rules over the instances of one group, the delay averaged over that group's other
members (ranks that never share one of its collectives do not dilute it). A group's straggler whose own waiting
in the other groups (at the instances where another rank arrives last) is at least CAUSE_MIN_SHARE of the delay
it causes passes that lateness on: `waits_for` names the rank it waits for most, and its group, and only the
stragglers whose lateness is their own are findings. The job's straggler is the one of those with the largest
delay.
"""

from __future__ import annotations

import msgspec
import numpy as np

from stepscope.analysis import intervals as iv
from stepscope.analysis.cross_rank.lateness import (
    MAGNITUDE_ALPHA,
    MAGNITUDE_MIN_SHARE,
    Arrivals,
    Lateness,
    judge,
)
from stepscope.analysis.per_rank.prepare import RankDigest
from stepscope.analysis.per_rank.steps import StepRow, pct
from stepscope.analysis.stats import median

STRAGGLER_MIN_PCT = 5.0  # delay per step, % of the mean step time ...
STRAGGLER_MIN_DELAY_MS = 1.0  # ... and at least this (less is the jitter of process scheduling)
CAUSE_MIN_SHARE = 0.5  # a cause explains at least this share of the delay
PHASES = (
    ("data_loader", "dataloader_us"),
    ("forward", "forward_us"),
    ("backward", "backward_us"),
    ("optimizer", "optimizer_us"),
)


class StragglerCause(msgspec.Struct):
    phase: str  # data_loader | forward | backward | optimizer | op | outside_regions
    name: str | None  # the op, for phase "op"
    rank_ms_per_step: float  # on the straggler
    others_ms_per_step: float  # median of the other ranks
    excess_ms_per_step: float


class Straggler(msgspec.Struct):
    """The rank the others wait for."""

    rank: int
    delay_ms_per_step: float  # mean over the matched steps of the time the others wait for it
    delay_pct: float  # of the mean step time
    last_in_steps: int  # steps in which it caused the most delay
    steps: int  # matched steps
    cause: StragglerCause | None
    share_pct: float | None = None  # of its group's waiting (the others' waiting for any rank)
    last_at: int = 0  # matched instances of its group at which it arrives last (and someone waits)
    instances: int = 0  # matched instances of its group at which someone waits


class PassedOn(msgspec.Struct):
    """The rank a group's straggler itself waits for in another group, where most of its lateness comes from."""

    rank: int
    group: str | None  # that group's name (null: unknown)
    dim: str | None
    ranks: list[int]  # that group's ranks
    wait_ms_per_step: float  # the straggler's waiting for that rank there, a union, per step


class GroupStraggler(msgspec.Struct):
    """The rank the other members of one process group wait for (`analyze --json`'s `stragglers`)."""

    group: str | None  # process-group name; null: unknown (the traces name none)
    dim: str | None  # its mesh dimension, else its description, else null
    ranks: list[int]  # its ranks where known, else the ranks whose instances of it were matched
    group_source: str  # how the group is known (per_rank/comm/groups.py's GROUP_SOURCES)
    rank: int
    delay_ms_per_step: float  # mean over the group's matched steps of the time its other members wait for it
    delay_pct: float  # of the mean step time
    last_in_steps: int
    steps: int  # the group's matched steps
    cause: StragglerCause | None  # null when its lateness is passed on (waits_for)
    waits_for: PassedOn | None = None  # its lateness is another rank's, waited for in another group
    root_rank: int | None = None  # the rank whose own lateness it is, following waits_for (itself when own)
    share_pct: float | None = None  # of the group's waiting (waiting_ms_per_step of its GroupWaiting)
    last_at: int = 0  # the group's matched instances at which it arrives last (and someone waits)
    instances: int = 0  # the group's matched instances at which someone waits
    p_value: float | None = None  # the chance that jitter alone makes it this late (lateness.py)


class RankWaitedFor(msgspec.Struct):
    """One rank that the others of a group waited for at some instance, and whether that is beyond jitter."""

    rank: int
    delay_ms_per_step: float  # the others' waiting for it, as GroupStraggler's
    share_pct: float  # of the group's waiting
    last_at: int  # instances at which it arrives last (and someone waits)
    p_value: float  # the order test's: the chance that jitter alone gives it a share this large (lateness.py)
    consistent: bool  # late beyond jitter
    straggler: bool  # consistent, and its delay is material (STRAGGLER_MIN_PCT, STRAGGLER_MIN_DELAY_MS)
    p_magnitude: float | None = (
        None  # the magnitude test's (its lateness per step, or per instance); null: none
    )


class GroupWaiting(msgspec.Struct):
    """A process group's waiting for peers, split among the ranks waited for, and its verdict: `stragglers`
    (some rank is late beyond jitter and holds it back materially), `no consistent straggler` (the rank waited
    for changes from collective to collective as jitter makes it), `little waiting` (a rank is consistently late,
    but by too little to matter)."""

    group: str | None
    dim: str | None
    ranks: list[int]
    waiting_ms_per_step: float  # the delays of every rank waited for, added up
    waiting_pct: float | None  # of the mean step time
    instances: int  # matched instances at which someone waits
    effective_instances: float  # what the test counts them as (lateness.py)
    persistence: float  # how often the last rank stays the same beyond chance (0..1)
    verdict: str  # "stragglers" | "no consistent straggler" | "little waiting"
    note: str  # the verdict in words
    waited_for: list[RankWaitedFor]  # largest delay first


class GroupKey(msgspec.Struct, frozen=True):
    """What the cross-rank pass knows of a group whose instances it matched."""

    group: str  # "" unknown
    dim: str | None
    ranks: tuple[int, ...]
    group_source: str


# (the rank last in, step) -> each other rank's waits, aligned, at the instances it was last in
Held = dict[tuple[int, int], dict[int, list[tuple[int, int]]]]


def group_stragglers(
    data: dict[int, RankDigest],
    step_rows: dict[int, list[StepRow]],
    held: dict[str, Held],
    groups: dict[str, GroupKey],
    steps: dict[str, list[int]],
    busy_ms: dict[int, float],
    arrivals: dict[str, Arrivals],
) -> tuple[list[GroupStraggler], list[GroupWaiting]]:
    """The stragglers of each process group (see the module doc), largest delay first, and each group's waiting
    with its verdict. `held`, `groups`, `steps`, `arrivals`: per group name, the waits, what is known of it, its
    matched steps (sorted) and its instances' arrival order (lateness.py)."""
    found: list[GroupStraggler] = []
    waiting: list[GroupWaiting] = []
    for name, key in groups.items():
        members = sorted((set(key.ranks) & set(data)) | {latest for latest, _ in held[name]})
        test = judge(arrivals.get(name, Arrivals()), len(members))
        if test is None:
            continue
        late = find_stragglers(
            data, step_rows, straggler_delays(held[name], members), steps[name], busy_ms, test, len(members)
        )
        waiting.append(_group_waiting(name, key, late, test, len(members)))
        for one in late.named:
            passed = _passed_on(one.rank, name, held, groups, len(steps[name]))
            if passed is not None and passed.wait_ms_per_step < CAUSE_MIN_SHARE * one.delay_ms_per_step:
                passed = None
            found.append(
                GroupStraggler(
                    group=name or None, dim=key.dim, ranks=list(key.ranks), group_source=key.group_source,
                    rank=one.rank, delay_ms_per_step=one.delay_ms_per_step, delay_pct=one.delay_pct,
                    last_in_steps=one.last_in_steps, steps=one.steps,
                    cause=one.cause if passed is None else None, waits_for=passed,
                    share_pct=one.share_pct, last_at=one.last_at, instances=one.instances,
                    p_value=_p(test.p_value.get(one.rank, 1.0)),
                )
            )  # fmt: skip
    by_group = {(g.rank, g.group): g for g in found}
    for g in found:
        at, hops = g, 0
        while at.waits_for is not None and hops <= len(found):
            w = at.waits_for
            nxt = by_group.get((w.rank, w.group))
            if nxt is None:  # (the rank it waits for does not stand out in that group: the lateness is its)
                g.root_rank = w.rank
                break
            at, hops = nxt, hops + 1
        else:
            g.root_rank = at.rank if at.waits_for is None else None
    found.sort(key=lambda g: (-g.delay_ms_per_step, g.rank, g.group or ""))
    waiting.sort(key=lambda w: (-w.waiting_ms_per_step, w.group or ""))
    return found, waiting


def _p(value: float) -> float:
    return float(f"{value:.3g}")


def _group_waiting(name: str, key: GroupKey, late: Late, test: Lateness, ranks: int) -> GroupWaiting:
    """A group's waiting, split among the ranks waited for, and its verdict in words."""
    named = {s.rank for s in late.named}
    rows = [
        RankWaitedFor(
            rank=r, delay_ms_per_step=round(ms, 3), share_pct=round(late.share_pct.get(r, 0.0), 2),
            last_at=late.last_at.get(r, 0), p_value=_p(test.p_value.get(r, 1.0)),
            p_magnitude=_p(test.p_step[r]) if r in test.p_step else None,
            consistent=test.consistent(r, ranks), straggler=r in named,
        )
        for r, ms in sorted(late.delay_ms.items(), key=lambda kv: (-kv[1], kv[0]))
        if ms > 0
    ]  # fmt: skip
    consistent = [w for w in rows if w.consistent]
    if named:
        verdict = "stragglers"
        note = "; ".join(f"rank {w.rank} holds {w.share_pct:.0f}% of it" for w in rows if w.straggler)
    elif consistent:
        verdict = "little waiting"
        note = (
            f"rank {consistent[0].rank} arrives last beyond jitter, but the others wait for it "
            f"{consistent[0].delay_ms_per_step:.3f} ms per step, too little to matter"
        )
    else:
        verdict = "no consistent straggler"
        top = rows[0] if rows else None
        if not test.decidable:
            note = (
                f"{test.instances} collectives (as {test.effective_instances:g} independent ones) are too few to "
                "tell a late rank from jitter"
            )
        elif top is not None and top.share_pct > 100.0 * MAGNITUDE_MIN_SHARE:
            p_step = test.p_step.get(top.rank)
            note = (
                f"rank {top.rank} holds {top.share_pct:.0f}% of the waiting, but {test.steps} steps cannot tell "
                "that from jitter (who arrives last: p = "
                f"{test.p_value.get(top.rank, 1.0):.2g}, with the order of all ranks p = {test.p_order:.2g}, "
                "0.001 needed"
                + (
                    f"; its lateness per step: p = {p_step:.2g}, needs p < {MAGNITUDE_ALPHA / ranks:.2g}"
                    if p_step is not None
                    else ""
                )
                + "); profile more steps"
            )
        else:
            note = "the rank waited for changes from collective to collective as jitter makes it"
        if top is not None:
            note += f" (most: rank {top.rank}, {top.share_pct:.0f}% of the waiting, last at {top.last_at} of {test.instances})"
    return GroupWaiting(
        group=name or None, dim=key.dim, ranks=list(key.ranks), waiting_ms_per_step=round(late.waiting_ms, 3),
        waiting_pct=late.waiting_pct, instances=test.instances, effective_instances=test.effective_instances,
        persistence=test.persistence, verdict=verdict, note=note, waited_for=rows,
    )  # fmt: skip


def _passed_on(
    rank: int, group: str, held: dict[str, Held], groups: dict[str, GroupKey], steps: int
) -> PassedOn | None:
    """The rank `rank` waits for most in the groups other than `group` (a union of its waits there), per step."""
    best: tuple[float, int, str] | None = None
    for name, by_latest in held.items():
        if name == group:
            continue
        spans: dict[int, list[tuple[int, int]]] = {}
        for (latest, _), others in by_latest.items():
            spans.setdefault(latest, []).extend(others.get(rank, []))
        for latest, waits in spans.items():
            if not waits:
                continue
            bounds = np.array(waits, dtype=np.int64)
            ns = float(iv.length(iv.merge(bounds[:, 0], bounds[:, 1])))
            if best is None or ns > best[0]:
                best = (ns, latest, name)
    if best is None or best[0] <= 0:
        return None
    ns, latest, name = best
    key = groups[name]
    return PassedOn(latest, name or None, key.dim, list(key.ranks), round(ns / 1e6 / max(steps, 1), 3))


def job_straggler(stragglers: list[GroupStraggler]) -> Straggler | None:
    """The job's straggler: of the groups' stragglers whose lateness is their own, the largest delay."""
    own = [g for g in stragglers if g.waits_for is None]
    if not own:
        return None
    g = own[0]  # (largest delay first)
    return Straggler(
        g.rank, g.delay_ms_per_step, g.delay_pct, g.last_in_steps, g.steps, g.cause,
        share_pct=g.share_pct, last_at=g.last_at, instances=g.instances,
    )  # fmt: skip


def straggler_delays(held: Held, ranks: list[int]) -> dict[int, dict[int, float]]:
    """rank -> step -> ns of delay it caused: the mean over the other ranks of the union of their waits at the
    instances it was last in (concurrent collectives wait for it once, not once each)."""
    delay: dict[int, dict[int, float]] = {r: {} for r in ranks}
    for (latest, step), others in held.items():
        waited = []
        for spans in others.values():
            bounds = np.array(spans, dtype=np.int64)
            waited.append(iv.length(iv.merge(bounds[:, 0], bounds[:, 1])))
        delay[latest][step] = float(np.mean(waited))
    return delay


class Late(msgspec.Struct, eq=False):
    """What find_stragglers measures of one group: each rank's delay per step and share of the waiting, how often
    it is last, the group's waiting, and the stragglers."""

    delay_ms: dict[int, float]
    share_pct: dict[int, float]
    last_at: dict[int, int]
    waiting_ms: float
    waiting_pct: float | None
    named: list[Straggler]


def find_stragglers(
    data: dict[int, RankDigest],
    step_rows: dict[int, list[StepRow]],
    delay: dict[int, dict[int, float]],
    steps: list[int],
    busy_ms: dict[int, float],
    test: Lateness,
    ranks: int,
) -> Late:
    """The stragglers of a group, largest delay first (see the module doc). `delay`: straggler_delays; `steps`:
    the matched steps, sorted; `busy_ms`: per rank, its mean step less its waiting for peers (ms); `test`: the
    group's lateness test, among `ranks` ranks."""
    n = max(len(steps), 1)
    delay_ms = {r: sum(d.values()) / n / 1e6 for r, d in delay.items()}
    waiting = sum(delay_ms.values())
    share = {r: 100.0 * ms / waiting for r, ms in delay_ms.items()} if waiting > 0 else {}
    step_means = [step_mean_ms(rows) for rows in step_rows.values() if rows]
    mean_step_ms = float(np.mean(step_means)) if step_means else 0.0
    found = Late(delay_ms, share, dict(test.last_at), waiting, pct(waiting, mean_step_ms), [])
    for rank in sorted(delay_ms, key=lambda r: (-delay_ms[r], r)):
        ms = delay_ms[rank]
        delay_pct = pct(ms, mean_step_ms)
        if not test.consistent(rank, ranks) or delay_pct is None:
            continue
        if delay_pct < STRAGGLER_MIN_PCT or ms < STRAGGLER_MIN_DELAY_MS:
            continue
        worst_in = sum(1 for s in steps if max(delay, key=lambda r: (delay[r].get(s, 0.0), -r)) == rank)
        cause = _cause(data, step_rows, rank, set(steps), ms, busy_ms)
        found.named.append(
            Straggler(
                rank, round(ms, 3), delay_pct, worst_in, len(steps), cause,
                share_pct=round(share[rank], 2), last_at=test.last_at.get(rank, 0), instances=test.instances,
            )
        )  # fmt: skip
    return found


def _cause(
    data: dict[int, RankDigest],
    step_rows: dict[int, list[StepRow]],
    rank: int,
    steps: set[int],
    delay_ms: float,
    busy_ms: dict[int, float],
) -> StragglerCause:
    """The straggler's own reason: a phase, else an op, else the time outside both (see the module doc)."""
    best: StragglerCause | None = None
    for phase, field in PHASES:
        means = {}
        for r, rows in step_rows.items():
            values = [getattr(row, field) for row in rows if row.step in steps]
            if values and all(v is not None for v in values):
                means[r] = float(np.mean(values)) / 1e3
        if rank not in means or len(means) < 2:
            continue
        found = _excess(phase, None, means, rank)
        if best is None or found.excess_ms_per_step > best.excess_ms_per_step:
            best = found
    if best is not None and best.excess_ms_per_step >= CAUSE_MIN_SHARE * delay_ms:
        return best
    op = _op_cause(data, rank, steps)
    if op is not None and op.excess_ms_per_step >= CAUSE_MIN_SHARE * delay_ms:
        return op
    return _excess("outside_regions", None, busy_ms, rank)


def _excess(phase: str, name: str | None, per_rank_ms: dict[int, float], rank: int) -> StragglerCause:
    others = median([v for r, v in per_rank_ms.items() if r != rank])
    return _cause_of(phase, name, per_rank_ms.get(rank, 0.0), others)


def _cause_of(phase: str, name: str | None, mine: float, others: float) -> StragglerCause:
    """The straggler's time per step in `phase` (or op `name`) against the median of the others (ms)."""
    return StragglerCause(phase, name, round(mine, 3), round(others, 3), round(mine - others, 3))


def _op_cause(data: dict[int, RankDigest], rank: int, steps: set[int]) -> StragglerCause | None:
    """The op whose self time per step exceeds the other ranks' most (collectives and step spans left out):
    CPU ops starting between the first and the end of the last of `steps` in each rank's window."""
    per_rank: dict[int, tuple[list[str], np.ndarray]] = {}  # rank -> (op names, ms per step)
    for r, d in data.items():
        keep = np.flatnonzero(np.isin(d.steps.number, list(steps)))
        if not len(keep):
            continue
        first, last = int(keep[0]), int(keep[-1])
        ns = d.op_inside[:, first : last + 1].sum(axis=1) + d.op_gap[:, first:last].sum(axis=1)
        per_rank[r] = (d.op_names, ns.reshape(len(d.op_names)).astype(np.float64) / 1e6 / len(keep))
    if rank not in per_rank or len(per_rank) < 2:
        return None
    names, mine = per_rank[rank]
    kept = np.flatnonzero(mine > 0)  # the straggler's ops, in its order
    if not len(kept):
        return None
    columns = {names[j]: c for c, j in enumerate(kept.tolist())}
    at_column: dict[tuple[str, ...], np.ndarray] = {}  # the ranks' op lists are mostly the same list
    others = np.zeros((len(per_rank) - 1, len(kept)))
    row = 0
    for r, (rank_names, ms) in per_rank.items():
        if r == rank:
            continue
        key = tuple(rank_names)
        if key not in at_column:
            at_column[key] = np.array([columns.get(name, -1) for name in rank_names], dtype=np.int64)
        where = at_column[key]
        found = (where >= 0) & (ms > 0)
        others[row, where[found]] = ms[found]
        row += 1
    others.sort(axis=0)
    n = len(others)
    middle = others[n // 2] if n % 2 else (others[n // 2 - 1] + others[n // 2]) / 2  # (as stats.median)
    best: StragglerCause | None = None
    for c, j in enumerate(kept.tolist()):
        found_cause = _cause_of("op", names[j], float(mine[j]), float(middle[c]))
        if best is None or found_cause.excess_ms_per_step > best.excess_ms_per_step:
            best = found_cause
    return best


def step_mean_ms(rows: list[StepRow]) -> float:
    """Mean step time of a rank's step rows, in ms."""
    return sum(r.dur_us for r in rows) / len(rows) / 1e3
