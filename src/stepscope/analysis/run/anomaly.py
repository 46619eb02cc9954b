"""The windows a watching run opened by itself (config watch=True, capture/window/auto.py), each compared with a
plain window of the same run, rank by rank: which phases of which ranks account for the extra time of its slow
steps, and which ranks only waited for them.

Both windows ran under the profiler, so its overhead is in both and cancels in the difference (a comparison with
the plain steps of metrics.jsonl would count it as slowness). A window's *slow steps* are those over the reference
window's median step by the watch's own margin (half the median, 5 ms at least) and by half of the window's
slowest step at least, on some rank; every rank is compared over those steps, per slow step:

- each rank's extra step time, and the extra time of its phases: data loading, forward, backward, optimizer,
  communication (the union of its collectives: in a CPU job the time the rank waits at them), and the rest of the
  step (code outside the annotated phases); beside them, the collectives (with their waiting) and GPU kernels
  whose time grew most, per step of the whole window;
- the *cause*: the ranks whose extra time lies in a phase other than communication, each at least half the job's
  extra (the median over ranks), the largest first; the ranks whose extra time is mostly communication *waited*
  for them;
- its check, said with it: the waiting ranks' extra communication against the cause's extra time (they agree
  when the waits are the cause's time seen from the other ranks), and how many slow steps it rests on.

No torch here; what it reads are two `AnalysisResult`s of the same run folder.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import msgspec

from stepscope.runfolder.payloads import WatchRecord
from stepscope.units import fmt_ranks

PHASE_WORDS = {
    "data_loader": "data loading",
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer",
    "communication": "communication",
    "rest": "code outside the annotated phases",
}
_FIELDS = {
    "data_loader": "dataloader_us",
    "forward": "forward_us",
    "backward": "backward_us",
    "optimizer": "optimizer_us",
}
SLOW_SHARE = 0.5  # a slow step: over the reference's median by half of it, and by SLOW_MIN_MS at least
SLOW_MIN_MS = 5.0
PEAK_SHARE = 0.5  # ... and over half of the extra time of the rank's slowest step in the window
CAUSE_SHARE = 0.5  # a cause rank's own extra (not communication) is at least this share of the job's extra
AGREE_SHARE = 0.25  # the waits and the cause agree when within this share of the cause
# "all of the extra time" from this share on (a cause over 100%: the others' steps gained less)
ALL_PCT = 95.0
SHOWN_CAUSES = 4  # cause ranks named one by one in the message; the rest are counted
ANOMALY_DECISIONS = ("window", "joined", "planned")
TOP_WORK = 3  # collectives and kernels listed per rank
MIN_WORK_MS = 0.1  # ... that grew by this much per step at least
LATE_STEPS = 64  # a rank's window this many steps after the asker's at most is the same request's, read late


class PhaseExtra(msgspec.Struct):
    phase: str  # data_loader, forward, backward, optimizer, communication, rest
    reference_ms: float  # median over the reference window's steps
    slow_ms: float  # mean over the slow steps
    extra_ms: float


class WorkExtra(msgspec.Struct):
    """A collective or a GPU kernel whose time per step of the window grew against the reference window."""

    kind: str  # "collective" or "kernel"
    name: str  # the collective's kind and group ("all_reduce, group 0"), the kernel's name
    reference_ms: float  # per step of the reference window
    window_ms: float  # per step of the window (all its steps, not only the slow ones)
    extra_ms: float
    wait_extra_ms: float | None = None  # of a collective: the growth of its waiting for the last rank


class RankExtra(msgspec.Struct):
    """One rank over the slow steps, per step, against its reference window."""

    rank: int
    reference_ms: float  # its median step in the reference window
    slow_ms: float  # its mean slow step
    extra_ms: float
    phases: list[PhaseExtra]  # the largest extra first
    role: str  # "cause", "waited" (mostly communication) or "other"
    work: list[
        WorkExtra
    ] = []  # the collectives and kernels that grew most (TOP_WORK), per step of the window


class PlannedWindow(msgspec.Struct):
    """A window of the watch, as its records say: its active steps, why, which rank asked."""

    first: int
    last: int
    why: str
    decision: str  # "window" (slow steps now) or "planned" (slow steps that recur, claimed ahead)
    asked_by: int | None
    ranks: list[int]  # the ranks whose records name this window
    late: list[str]  # ranks that recorded other steps for the same request (they read it late), in words
    also: list[int] = []  # the last active steps of those ranks' windows


class AnomalyWindow(msgspec.Struct):
    """One window of the watch against its reference: what the analysis found (see the module's doc)."""

    first: int
    last: int
    why: str  # what the watch saw, in its words
    decision: str
    asked_by: int | None
    reference: (
        list[int] | None
    )  # [first, last] active steps of the reference window; null: none to compare with
    slow_steps: list[int]
    factor: float | None  # the job's slow step over its reference step (medians over ranks)
    extra_ms: float | None  # per slow step, the median over ranks
    cause_ranks: list[int]
    cause_phase: str | None
    cause_ms: float | None  # the first cause rank's extra in that phase, per slow step
    cause_share_pct: float | None  # of the job's extra
    waited: list[int]
    ranks: list[RankExtra]
    message: str
    check: str  # how the figures were checked against each other, and what is not known
    notes: list[str] = []
    also: list[int] = []  # the last steps of the windows of ranks that read the request late


def watch_windows(
    records: Sequence[WatchRecord], traced: set[int]
) -> tuple[list[PlannedWindow], list[int] | None]:
    """The watch's windows whose traces exist (by their last active step, `traced`: the steps the run's traces are
    named after), in order, and the reference window the records name (null: none)."""
    reference = None
    by_last: dict[int, list[WatchRecord]] = {}
    for record in records:
        if record.window is None:
            continue
        if record.decision == "reference":
            reference = list(record.window) if record.window[1] in traced else reference
        elif record.decision in ANOMALY_DECISIONS:
            by_last.setdefault(record.window[1], []).append(record)
    found: list[PlannedWindow] = []
    claimed: set[int] = set()
    for last in sorted(by_last):
        said = by_last[last]
        asker = next((r for r in said if r.decision in ("window", "planned")), None)
        if asker is None:  # only ranks that read another's claim late: found with that claim's window
            continue
        if last not in traced:
            continue
        claimed.add(last)
        found.append(
            PlannedWindow(
                first=asker.window[0] if asker.window else last,
                last=last,
                why=asker.why,
                decision=asker.decision,
                asked_by=asker.rank,
                ranks=sorted({r.rank for r in said}),
                late=[],
            )
        )
    # a rank that read a claim after its start recorded later steps: said on the window it belongs to
    for last, said in by_last.items():
        if last in claimed:
            continue
        window = next((w for w in reversed(found) if 0 < last - w.last <= LATE_STEPS), None)
        if window is None:
            continue
        window.also.append(last)
        for record in said:
            first = record.window[0] if record.window else last
            window.late.append(f"rank {record.rank} recorded steps {first}-{last} (it read the request late)")
    return found, reference


def fallback_reference(
    windows: Sequence[PlannedWindow], traced: Sequence[tuple[int, int]]
) -> list[int] | None:
    """A plain window of the run when the records name none: the latest window (first, last active steps, in
    `traced`) that is not one of the watch's and ends before the first of them, else the earliest other."""
    theirs = {w.last for w in windows}
    plain = [list(w) for w in traced if w[1] not in theirs]
    if not plain:
        return None
    first = min(w.first for w in windows) if windows else None
    before = [w for w in plain if first is None or w[1] < first]
    return before[-1] if before else plain[0]


def compare(
    window: PlannedWindow,
    anomaly: Sequence[Any],
    reference: Sequence[Any] | None,
    reference_steps: list[int] | None,
) -> AnomalyWindow:
    """`anomaly`, `reference`: the ranks' analyses (RankAnalysis: `rank`, `steps`) of the window, each rank's own
    (one that read the request late recorded later steps), and of the reference window."""
    notes = list(window.late)

    def made(**rest: Any) -> AnomalyWindow:
        return AnomalyWindow(
            first=window.first, last=window.last, why=window.why, decision=window.decision,
            asked_by=window.asked_by, reference=reference_steps, notes=notes, also=list(window.also), **rest,
        )  # fmt: skip

    mine = {r.rank: r.steps for r in anomaly if r.steps}
    theirs = {r.rank: r.steps for r in reference if r.steps} if reference is not None else {}
    whole = {r.rank: r for r in anomaly}
    base_whole = {r.rank: r for r in reference} if reference is not None else {}
    ranks = sorted(set(mine) & set(theirs))
    missing = sorted(set(mine) - set(theirs))
    if missing:
        notes.append(f"ranks {_listed(missing)} have no reference window: left out")
    if not ranks:
        return made(
            slow_steps=[], factor=None, extra_ms=None, cause_ranks=[], cause_phase=None, cause_ms=None,
            cause_share_pct=None, waited=[], ranks=[],
            message=f"Steps {window.first}-{window.last}: {window.why}; no plain window of the run to compare them with",
            check="not compared: no reference window with the same ranks",
        )  # fmt: skip
    ref_median = {r: statistics.median(s.dur_us for s in theirs[r]) / 1e3 for r in ranks}
    slow: set[int] = set()
    for r in ranks:
        extra = {s.step: s.dur_us / 1e3 - ref_median[r] for s in mine[r]}
        # over the watch's margin, and at least half as slow as the rank's slowest step of the window (a step of
        # ordinary noise beside the slow ones would thin their figures out)
        bound = max(SLOW_SHARE * ref_median[r], SLOW_MIN_MS, PEAK_SHARE * max(extra.values()))
        slow |= {step for step, ms in extra.items() if ms > bound}
    slow_steps = sorted(slow)
    if not slow_steps:
        return made(
            slow_steps=[], factor=None, extra_ms=None, cause_ranks=[], cause_phase=None, cause_ms=None,
            cause_share_pct=None, waited=[], ranks=[],
            message=(
                f"Steps {window.first}-{window.last}: {window.why}; none of the window's steps is slower than the "
                "reference window's: the slowness was over before the window began"
            ),
            check=f"every step of the window within half of the reference's median step ({SLOW_MIN_MS:g} ms at least)",
        )  # fmt: skip
    extras = [_rank_extra(r, mine[r], theirs[r], slow) for r in ranks]
    for e in extras:
        e.work = _work_extra(whole[e.rank], base_whole[e.rank])
    job_extra = statistics.median(e.extra_ms for e in extras)
    factor = statistics.median(e.slow_ms for e in extras) / max(
        statistics.median(e.reference_ms for e in extras), 1e-9
    )
    own = {e.rank: _own(e) for e in extras}  # the largest phase other than communication
    # a rank whose extra time is mostly communication waited, whatever phase holds the wait (a collective inside
    # the user's backward region counts in both); the others' own phases are the candidates
    waited = [
        e.rank
        for e in extras
        if e.extra_ms > 0 and _phase(e, "communication") >= CAUSE_SHARE * max(e.extra_ms, 1e-9)
    ]
    causes = sorted(
        (e for e in extras if e.rank not in waited and own[e.rank][1] >= CAUSE_SHARE * max(job_extra, 1e-9)),
        key=lambda e: -own[e.rank][1],
    )
    for e in extras:
        e.role = "cause" if e in causes else "waited" if e.rank in waited else "other"
    if causes:
        lead = causes[0]
        phase, cause_ms = own[lead.rank]
        share = 100.0 * cause_ms / job_extra if job_extra > 0 else None
    else:
        phase, cause_ms, share = None, None, None
    message = _message(window, slow_steps, extras, factor, job_extra, causes, own, waited, share)
    check = _check(extras, causes, own, waited, slow_steps)
    return made(
        slow_steps=slow_steps,
        factor=round(factor, 2),
        extra_ms=round(job_extra, 3),
        cause_ranks=[e.rank for e in causes],
        cause_phase=phase,
        cause_ms=None if cause_ms is None else round(cause_ms, 3),
        cause_share_pct=None if share is None else round(share, 1),
        waited=waited,
        ranks=extras,
        message=message,
        check=check,
    )


def _rank_extra(rank: int, steps: Sequence[Any], reference: Sequence[Any], slow: set[int]) -> RankExtra:
    chosen = [s for s in steps if s.step in slow] or list(steps)
    ref = {p: statistics.median(_part(s, p) for s in reference) for p in PHASE_WORDS}
    now = {p: statistics.fmean(_part(s, p) for s in chosen) for p in PHASE_WORDS}
    phases = sorted(
        (PhaseExtra(p, round(ref[p], 3), round(now[p], 3), round(now[p] - ref[p], 3)) for p in PHASE_WORDS),
        key=lambda x: -x.extra_ms,
    )
    ref_ms = statistics.median(s.dur_us for s in reference) / 1e3
    slow_ms = statistics.fmean(s.dur_us for s in chosen) / 1e3
    return RankExtra(rank, round(ref_ms, 3), round(slow_ms, 3), round(slow_ms - ref_ms, 3), phases, "other")


def _work_extra(window: Any, reference: Any) -> list[WorkExtra]:
    """The collectives (by kind and group) and GPU kernels of a rank whose time per step grew most, from the
    two windows' totals (RankAnalysis `collectives`, `top_kernels`; any missing attribute: none)."""
    n, m = max(len(window.steps), 1), max(len(reference.steps), 1)

    def collectives(rank: Any, steps: int) -> dict[str, tuple[float, float | None]]:
        out: dict[str, tuple[float, float | None]] = {}
        for c in getattr(rank, "collectives", None) or []:
            name = f"{c.kind}, group {c.group}" if c.group is not None else c.kind
            time, wait = out.get(name, (0.0, None))
            waited = None if c.wait_ms is None else (wait or 0.0) + c.wait_ms / steps
            out[name] = (time + (c.time_ms or 0.0) / steps, waited)
        return out

    def kernels(rank: Any, steps: int) -> dict[str, float]:
        return {k.name: k.total_us / 1e3 / steps for k in getattr(rank, "top_kernels", None) or []}

    found = []
    now, before = collectives(window, n), collectives(reference, m)
    for name, (time, wait) in now.items():
        was, was_wait = before.get(name, (0.0, None))
        waited = None if wait is None or was_wait is None else round(wait - was_wait, 3)
        found.append(
            WorkExtra("collective", name, round(was, 3), round(time, 3), round(time - was, 3), waited)
        )
    now_k, before_k = kernels(window, n), kernels(reference, m)
    for name, time in now_k.items():
        was = before_k.get(name, 0.0)
        found.append(WorkExtra("kernel", name, round(was, 3), round(time, 3), round(time - was, 3)))
    found.sort(key=lambda w: -w.extra_ms)
    return [w for w in found if w.extra_ms >= MIN_WORK_MS][:TOP_WORK]


def _part(step: Any, phase: str) -> float:
    """ms of `phase` in a step row; "rest": the step less its phases and its communication (at least 0)."""
    if phase == "communication":
        return (step.comm_us or 0.0) / 1e3
    if phase == "rest":
        known = sum((getattr(step, f) or 0.0) for f in _FIELDS.values()) + (step.comm_us or 0.0)
        return max(step.dur_us - known, 0.0) / 1e3
    return (getattr(step, _FIELDS[phase]) or 0.0) / 1e3


def _phase(extra: RankExtra, phase: str) -> float:
    return next(p.extra_ms for p in extra.phases if p.phase == phase)


def _own(extra: RankExtra) -> tuple[str, float]:
    best = max((p for p in extra.phases if p.phase != "communication"), key=lambda p: p.extra_ms)
    return best.phase, best.extra_ms


def work_line(window: AnomalyWindow) -> str:
    """The collectives and kernels that grew most on each rank, in words ("" when none did)."""
    parts = []
    for rank in window.ranks:
        for w in rank.work[:1]:
            wait = "" if w.wait_extra_ms is None else f", waiting {w.wait_extra_ms:+.1f}"
            parts.append(f"rank {rank.rank} {w.name} {w.extra_ms:+.1f} ms{wait}")
    if not parts:
        return ""
    return "grew most, per step of the window: " + "; ".join(parts)


def _listed(ranks: Sequence[int]) -> str:
    return fmt_ranks(sorted(ranks))


def _each(causes: list[RankExtra], part: Any) -> str:
    """The causes' parts, the largest SHOWN_CAUSES of them and how many more: a line however many ranks."""
    shown = ", ".join(part(e) for e in causes[:SHOWN_CAUSES])
    more = len(causes) - SHOWN_CAUSES
    return shown + (f" and {more} more rank{'s' if more > 1 else ''}" if more > 0 else "")


def _message(
    window: PlannedWindow, slow_steps: list[int], extras: list[RankExtra], factor: float, job_extra: float,
    causes: list[RankExtra], own: dict[int, tuple[str, float]], waited: list[int], share: float | None,
) -> str:  # fmt: skip
    steps = _steps(slow_steps)
    everyone = all(e.extra_ms >= CAUSE_SHARE * job_extra for e in extras) and len(extras) > 1
    where = (
        "on every rank"
        if everyone
        else f"on ranks {_listed([e.rank for e in extras if e.extra_ms >= CAUSE_SHARE * job_extra])}"
    )
    if len(extras) == 1:
        where = f"on rank {extras[0].rank}"
    head = f"{steps} took {factor:.1f}x as long {where} as the reference window's steps (+{job_extra:.1f} ms per step)"
    head = head[0].upper() + head[1:]
    if not causes:
        worst = max(extras, key=lambda e: _phase(e, "communication"))
        return (
            f"{head}: no rank's own work accounts for it; the extra time is communication (rank {worst.rank} "
            f"+{_phase(worst, 'communication'):.1f} ms): a collective, the network or a rank outside these windows"
        )
    lead = causes[0]
    phase, ms = own[lead.rank]
    if len(causes) == 1:
        part = "all" if share is None or share >= ALL_PCT else f"{share:.0f}%"
        text = f"{head}: {part} of the extra time is rank {lead.rank}'s {PHASE_WORDS[phase]} (+{ms:.1f} ms)"
    elif len({own[e.rank][0] for e in causes}) == 1:
        each = _each(causes, lambda e: f"rank {e.rank} +{own[e.rank][1]:.1f} ms")
        text = f"{head}: the ranks' own {PHASE_WORDS[phase]} ({each})"
    else:
        each = _each(
            causes, lambda e: f"rank {e.rank}'s {PHASE_WORDS[own[e.rank][0]]} +{own[e.rank][1]:.1f} ms"
        )
        text = f"{head}: the ranks' own work ({each})"
    if waited:
        who = "the others" if len(waited) + len(causes) == len(extras) else f"ranks {_listed(waited)}"
        text += f"; {who} waited for it in communication"
    return text


def _steps(slow_steps: list[int]) -> str:
    if len(slow_steps) == 1:
        return f"step {slow_steps[0]}"
    if slow_steps[-1] - slow_steps[0] + 1 == len(slow_steps):
        return f"steps {slow_steps[0]}-{slow_steps[-1]}"
    return f"steps {', '.join(map(str, slow_steps))}"


def _check(
    extras: list[RankExtra], causes: list[RankExtra], own: dict[int, tuple[str, float]], waited: list[int],
    slow_steps: list[int],
) -> str:  # fmt: skip
    parts = [
        f"{len(slow_steps)} slow step(s) of the window against the reference window's median step, both profiled"
    ]
    if causes and waited:
        lead_ms = own[causes[0].rank][1]
        waits = [_phase(e, "communication") for e in extras if e.rank in waited]
        wait_ms = statistics.median(waits)
        apart = abs(wait_ms - lead_ms) / max(lead_ms, 1e-9)
        verdict = (
            "agree" if apart <= AGREE_SHARE else "do not agree: other work or the machine may be at work too"
        )
        parts.append(
            f"the waiting ranks' extra communication (median +{wait_ms:.1f} ms) and rank {causes[0].rank}'s extra "
            f"{PHASE_WORDS[own[causes[0].rank][0]]} (+{lead_ms:.1f} ms) are {100 * apart:.0f}% apart: they {verdict}"
        )
    if len(slow_steps) < 2:
        parts.append("one slow step: a single sample, no spread")
    return "; ".join(parts)


__all__ = [
    "AnomalyWindow",
    "PlannedWindow",
    "RankExtra",
    "WorkExtra",
    "compare",
    "fallback_reference",
    "watch_windows",
]
