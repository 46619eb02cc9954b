"""`--fail-on` gates of `stepscope diff`: parse `METRIC>+N%` and friends, and decide each against a Diff.

A gate on a time breaches only when the change's whole 95% interval (see _shift.py) lies beyond the gate's
threshold: the change is significant, and larger than the threshold even at its low end. The runs' own spread
decides what is noise, the threshold what matters, and a change that may still be within the threshold passes
(the reason says so). The step time's gate also asks the fast steps (diff_steps.FAST_QUANTILE) to have moved
beyond the threshold, where there are enough steps to tell: a slower code path slows every step, while a
machine busier during one run than the other slows only more of its steps.

A gate on a phase of the profiled window needs the step time over the plain steps (run folders) to have moved
significantly the same way, its fast steps too, and by at least 1 / WINDOW_SLACK of the phase's change at its
low end: a few consecutive profiled steps share one moment of the machine, so their spread cannot tell a slower
phase from a busier machine, while the plain steps cover the run. And its threshold counts beyond the plain
steps' own relative change, up to MACHINE_SLOWDOWN: a run slower everywhere by X% has every phase X% slower,
and a phase gate asks what changed in that phase beyond it. With too few values to bound the change a gate is
not checked, and says so.

`new_high>N` counts the findings that are HIGH in TEST but were not HIGH in BASE (new, or escalated from a lower
severity), except one whose own phase (diff_findings.FINDING_PHASES) shows no significant change (its share of
the step moved, or one disturbed step of the window carries it, not its time) and, for run folders, one the
step time over the plain steps does not confirm by a significant growth.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import msgspec

from stepscope.analysis.diff._shift import ONE_SIDED_ALPHA, beyond_p
from stepscope.analysis.diff.compare import PHASE_LABELS, Diff, FindingChange, Gate
from stepscope.analysis.diff.phases import PHASES

GATE_RE = re.compile(r"^\s*([a-z_]+)\s*([<>])\s*([+-]?\d+(?:\.\d+)?)\s*(%|ms|us|s)?\s*$")
# step_time: the plain steps of run folders (diff_steps.py); the rest: the profiled window's phases
GATE_METRICS = ("step_time", *(p for p in PHASES if p != "profiled_step"), "new_high")
_UNIT_MS = {"ms": 1.0, "us": 1e-3, "s": 1e3}
# A phase of the profiled window may move by up to this many times what the plain steps' step time moved: the
# profiler slows the window (measured: a 5 ms sleep per step read +7.1 to +7.4 ms in the window, under load).
WINDOW_SLACK = 2.0
# The most a busier machine slowed a whole run in our measurements (runs of one script seconds apart on the
# 2-core development machine: 10-20%): a phase gate discounts the plain steps' relative change up to this much.
MACHINE_SLOWDOWN = 0.2


def parse_gate(expression: str) -> tuple[str, str, float, str | None]:
    """`step_time>+5%` -> ("step_time", ">", 5.0, "%"). Raises ValueError with the reason when malformed."""
    m = GATE_RE.match(expression)
    if m is None:
        raise ValueError(
            f"{expression!r} is not METRIC>+N% / METRIC>+Nms / METRIC<-N% / new_high>N (e.g. 'step_time>+5%', "
            "'forward>+2ms', 'new_high>0'); repeat --fail-on for several gates"
        )
    metric, op, number, unit = m.group(1), m.group(2), float(m.group(3)), m.group(4)
    if metric not in GATE_METRICS:
        raise ValueError(f"{expression!r}: unknown metric {metric!r} (one of {', '.join(GATE_METRICS)})")
    if metric == "new_high":
        if unit is not None or op != ">":
            raise ValueError(f"{expression!r}: new_high takes a count, as in 'new_high>0'")
    elif unit is None:
        raise ValueError(
            f"{expression!r}: give the change in % or in ms / us / s, e.g. '{metric}{op}{'+' if op == '>' else '-'}"
            f"{m.group(3).lstrip('+-')}%'"
        )
    sign = m.group(3)[0]
    if (op == ">" and sign == "-") or (op == "<" and sign == "+"):
        # the sign may be left out ('step_time>5%' is 'step_time>+5%'), but never contradict the comparison
        raise ValueError(f"{expression!r}: '>' takes an increase (+N), '<' a decrease (-N)")
    return metric, op, abs(number), unit


def evaluate_gates(diff: Diff, expressions: Sequence[str]) -> list[Gate]:
    """Each `--fail-on` expression against the diff (see parse_gate and the module's docstring)."""
    gates = []
    for expression in expressions:
        metric, op, number, unit = parse_gate(expression)
        if metric == "new_high":
            gates.append(_new_high(diff, expression, number))
        else:
            gates.append(_time_gate(diff, expression, metric, op, number, unit))
    return gates


class _Measure(msgspec.Struct):
    """What a time gate judges: one metric's medians in both runs and its change, pooled or of one rank."""

    base: float | None
    test: float | None
    delta: float | None
    low: float | None
    high: float | None
    counts: tuple[int, int]
    base_sample: list[float] = []  # the values, where too few bound an interval
    test_sample: list[float] = []
    rank: int | None = None  # null: the pooled ranks


def _time_gate(diff: Diff, expression: str, metric: str, op: str, number: float, unit: str | None) -> Gate:
    """Per rank first: a phase of a job with several ranks is judged on each rank present in both runs, and on
    the ranks pooled where their changes agree (more values, a narrower interval). Any rank beyond the threshold
    breaches, the worst one named; the gate passes when the pooled ranks pass and agree, or every rank passes;
    else it is undecided."""
    label = PHASE_LABELS.get(metric, metric)
    pooled, by_rank, agree = _measures(diff, metric)
    outcome, reason, low, high = _judge(diff, pooled, label, metric, op, number, unit)
    gate = Gate(expression, metric, pooled.base, pooled.test, None, False, pooled.delta, low, high, reason)
    if pooled.base is not None and pooled.delta is not None and pooled.base:
        gate.change_pct = round(100.0 * pooled.delta / pooled.base, 2)
    gate.outcome = outcome
    if len(by_rank) > 1:
        judged = [(m, _judge(diff, m, label, metric, op, number, unit)) for m in by_rank]
        breached = [(m, j) for m, j in judged if j[0] == "breach"]
        undecided = [(m, j) for m, j in judged if j[0] == "undecided"]
        if outcome == "breach" and agree:
            gate.reason = f"ranks {_rank_list(by_rank)} pooled (their changes agree): {reason}"
        elif breached:
            worst, (_, why, w_low, w_high) = max(breached, key=lambda x: abs(x[0].delta or 0.0))
            gate.outcome, gate.rank, gate.ranks = (
                "breach",
                worst.rank,
                [m.rank for m, _ in breached if m.rank is not None],
            )
            _take(gate, worst, w_low, w_high)
            others = (
                f" (breached on ranks {_rank_list([m for m, _ in breached])})" if len(breached) > 1 else ""
            )
            gate.reason = f"rank {worst.rank}: {why}{others}"
        elif outcome == "pass" and agree:
            gate.reason = f"ranks {_rank_list(by_rank)} pooled (their changes agree): {reason}"
        elif not undecided:
            gate.outcome = "pass"
            largest, (_, why, _, _) = max(judged, key=lambda x: abs(x[0].delta or 0.0))
            gate.reason = (
                f"every rank passes ({_rank_list(by_rank)}); the largest change, rank {largest.rank}: {why}"
            )
        else:
            first, (_, why, f_low, f_high) = undecided[0]
            gate.outcome, gate.rank, gate.ranks = (
                "undecided",
                first.rank,
                [m.rank for m, _ in undecided if m.rank is not None],
            )
            _take(gate, first, f_low, f_high)
            more = (
                f" (undecided on ranks {_rank_list([m for m, _ in undecided])})" if len(undecided) > 1 else ""
            )
            gate.reason = f"rank {first.rank}: {why}{more}"
    gate.breached = gate.outcome == "breach"
    return gate


def _take(gate: Gate, m: _Measure, low: float | None, high: float | None) -> None:
    """The gate's figures become the rank's whose verdict it carries: its medians, change and interval."""
    gate.base, gate.test, gate.delta_ms, gate.low_ms, gate.high_ms = m.base, m.test, m.delta, low, high
    gate.change_pct = round(100.0 * m.delta / m.base, 2) if m.delta is not None and m.base else None


def _rank_list(measures: Sequence[_Measure]) -> str:
    from stepscope.units import fmt_ranks

    return fmt_ranks(sorted(m.rank for m in measures if m.rank is not None))


def _measures(diff: Diff, metric: str) -> tuple[_Measure, list[_Measure], bool]:
    """The metric pooled over the ranks, by rank (phases of several ranks), and whether the ranks agree."""
    if metric == "step_time":
        st = diff.step_time
        return (
            _Measure(
                st.base.median_ms,
                st.test.median_ms,
                st.delta_ms,
                st.low_ms,
                st.high_ms,
                (st.base.values, st.test.values),
                st.base_sample,
                st.test_sample,
            ),
            [],
            True,
        )
    phase = next((p for p in diff.phases if p.name == metric), None)
    if phase is None:
        return _Measure(None, None, None, None, None, (0, 0)), [], True
    pooled = _Measure(
        phase.base_ms,
        phase.test_ms,
        phase.delta_ms,
        phase.low_ms,
        phase.high_ms,
        (phase.base_values, phase.test_values),
        phase.base_sample,
        phase.test_sample,
    )
    by_rank = [
        _Measure(
            r.base_ms,
            r.test_ms,
            r.delta_ms,
            r.low_ms,
            r.high_ms,
            (r.base_values, r.test_values),
            r.base_sample,
            r.test_sample,
            r.rank,
        )
        for r in phase.by_rank
    ]
    return pooled, by_rank, phase.ranks_agree is not False


def _judge(
    diff: Diff, m: _Measure, label: str, metric: str, op: str, number: float, unit: str | None
) -> tuple[str, str, float | None, float | None]:
    """(outcome, reason, low, high) of one measure against the gate; low and high: the interval judged (for
    few values, the range of the test - base differences that the exact test found beyond the threshold)."""
    base, test, delta, low, high = m.base, m.test, m.delta, m.low, m.high
    if base is None and test is None:
        return "pass", f"neither run shows {label}: nothing to compare", None, None
    if base is None or test is None or delta is None:
        which = "base" if base is None else "test"
        return "undecided", f"the {which} run does not show {label}: cannot compare", None, None
    limit = base * number / 100 if unit == "%" else number * _UNIT_MS[unit or "ms"]
    grew = op == ">"
    bound = f"{'+' if grew else '-'}{number:g}{unit}"
    if low is None or high is None:
        decided = _exact(m, grew, limit, label, bound, metric, base if unit == "%" else None)
        if decided[0] != "breach":
            return decided
        _, exact_reason, low, high = decided
        assert low is not None and high is not None
    else:
        exact_reason = None
    change = _change_text(delta, low, high, base if unit == "%" else None)
    if exact_reason is not None:
        change = exact_reason
    if not (low > 0 or high < 0):
        return "pass", f"{label} {change}: the interval holds 0, no significant change", low, high
    if not (low > limit if grew else high < -limit):
        may = (delta > limit) if grew else (delta < -limit)
        return "pass", f"{label} {change}: {'may be' if may else 'significant,'} within {bound}", low, high
    if metric == "step_time" and not _fast_steps_beyond(diff, grew, number, unit):
        st = diff.step_time
        assert st.fast_delta_ms is not None and st.fast_low_ms is not None and st.fast_high_ms is not None
        fast = _change_text(
            st.fast_delta_ms, st.fast_low_ms, st.fast_high_ms, st.base.fast_ms if unit == "%" else None
        )
        return (
            "pass",
            f"{label} {change}, but its fast steps (10th percentile) moved {fast}: more of the steps were slow, "
            f"not every step (a busier machine, or a cost on some steps only); not beyond {bound}",
            low,
            high,
        )
    if metric != "step_time" and not _step_time_confirms(diff, grew, (low if grew else high) / WINDOW_SLACK):
        return (
            "pass",
            f"{label} {change} in the profiled window, but the step time over the plain steps does not move "
            f"that much, significantly, the same way: not confirmed, not breached",
            low,
            high,
        )
    if metric != "step_time" and not _beyond_the_step(diff, grew, low, high, base, limit):
        scaled = 100.0 * _step_ratio(diff, grew)
        return (
            "pass",
            f"{label} {change}, but the whole step moved {scaled:+.1f}% (plain steps' median): beyond that, the "
            f"phase's change may be within {bound}",
            low,
            high,
        )
    unconfirmed = ""
    if metric != "step_time" and diff.step_time.base.source != "plain":
        unconfirmed = " (no plain steps to confirm the profiled window with: " + (
            "too few in the run folders)"
            if diff.step_time.note and "plain steps" in diff.step_time.note
            else "traces)"
        )
    return "breach", f"{label} {change}: beyond {bound}{unconfirmed}", low, high


def _exact(
    m: _Measure, grew: bool, limit: float, label: str, bound: str, metric: str, pct_of: float | None
) -> tuple[str, str, float | None, float | None]:
    """Too few values for an interval: the exact one-sided rank test (_shift.beyond_p) of the change beyond the
    threshold, and of the change within it; neither at ONE_SIDED_ALPHA is undecided."""
    n, k = m.counts
    b, t = m.base_sample, m.test_sample
    more = (
        "record more active steps, e.g. --active 8"
        if metric != "step_time"
        else "run folders with 8 plain steps or more a side, or more active steps"
    )
    if not b or not t:
        return "undecided", f"{n} and {k} values are too few to decide ({more})", None, None
    # the gate's direction as "test above base": a decrease gate looks at the values negated
    sign = 1.0 if grew else -1.0
    bs, ts = [sign * v for v in b], [sign * v for v in t]
    beyond = beyond_p(bs, ts, limit)
    within = beyond_p(ts, bs, -limit)  # base above test - limit: the change within the threshold
    diffs = (min(t) - max(b), max(t) - min(b))
    shown = _change_text(m.delta or 0.0, *diffs, pct_of)
    if beyond <= ONE_SIDED_ALPHA:
        reason = (
            f"{shown.replace('95%:', 'range:')}, every one of {k} test values beyond every one of {n} base values "
            f"by more than {bound} (exact rank test, one-sided p = {beyond:.3g})"
        )
        return "breach", reason, diffs[0], diffs[1]
    if within <= ONE_SIDED_ALPHA:
        return (
            "pass",
            f"{label} {shown.replace('95%:', 'range:')}: within {bound} by an exact rank test "
            f"(one-sided p = {within:.3g})",
            None,
            None,
        )
    return (
        "undecided",
        f"{label} {shown.replace('95%:', 'range:')}: {n} and {k} values overlap too much for an exact rank "
        f"test to decide either way at {ONE_SIDED_ALPHA:g} ({more})",
        None,
        None,
    )


def _step_ratio(diff: Diff, grew: bool) -> float:
    """The plain steps' relative change in the gate's direction, at most MACHINE_SLOWDOWN (0 when they moved the
    other way or are absent): beyond it, a change of the whole step is no busier machine but a cost added."""
    st = diff.step_time
    if st.base.source != "plain" or st.delta_ms is None or not st.base.median_ms:
        return 0.0
    ratio = st.delta_ms / st.base.median_ms
    return min(max(ratio, 0.0), MACHINE_SLOWDOWN) if grew else max(min(ratio, 0.0), -MACHINE_SLOWDOWN)


def _beyond_the_step(diff: Diff, grew: bool, low: float, high: float, base: float, limit: float) -> bool:
    """Whether a phase moved beyond the threshold by more than the whole step's relative change explains: a run
    slower everywhere by X% (a busier machine) has every phase X% slower; a phase gate asks what changed in that
    phase beyond it."""
    explained = base * _step_ratio(diff, grew)
    return low - explained > limit if grew else high - explained < -limit


def _fast_steps_beyond(diff: Diff, grew: bool, number: float, unit: str | None) -> bool:
    """Whether the fast steps moved beyond the threshold with their whole interval; True without an interval."""
    st = diff.step_time
    if st.fast_low_ms is None or st.fast_high_ms is None or not st.base.fast_ms:
        return True
    limit = st.base.fast_ms * number / 100 if unit == "%" else number * _UNIT_MS[unit or "ms"]
    return st.fast_low_ms > limit if grew else st.fast_high_ms < -limit


def _step_time_confirms(diff: Diff, grew: bool, by_ms: float = 0.0) -> bool:
    """Whether the step time over the plain steps, its fast steps too, moved significantly in that direction, by
    as much as `by_ms` within its interval (a phase cannot grow by more than the step it is part of); True when
    the runs have no plain steps to compare (traces), as nothing can confirm the window then."""
    st = diff.step_time
    if st.base.source != "plain" or st.low_ms is None or st.high_ms is None:
        return True
    moved = st.low_ms > 0 and st.high_ms >= by_ms if grew else st.high_ms < 0 and st.low_ms <= by_ms
    if st.fast_low_ms is None or st.fast_high_ms is None:
        return moved
    return moved and (st.fast_low_ms > 0 if grew else st.fast_high_ms < 0)


def _change_text(delta: float, low: float, high: float, base: float | None) -> str:
    """'+23.0% (95%: +18.1% to +27.9%)' against `base`, or '+1.20 ms (95%: ...)' without one."""
    from stepscope.units import fmt_ms

    def show(ms: float) -> str:
        if base:
            return f"{100.0 * ms / base:+.1f}%"
        return ("+" if ms > 0 else "") + fmt_ms(ms) if ms else "0"

    return f"{show(delta)} (95%: {show(low)} to {show(high)})"


def became_high(diff: Diff) -> list[FindingChange]:
    """The findings HIGH in test that were not HIGH in base: new, or escalated."""
    return [
        c
        for c in diff.findings
        if c.severity == "high"
        and (c.status == "appeared" or (c.status == "changed" and c.base_severity != "high"))
    ]


def _new_high(diff: Diff, expression: str, number: float) -> Gate:
    rising = became_high(diff)
    confirmed = _step_time_confirms(diff, grew=True)
    phase_still = [c for c in rising if c.phase_significant is False]
    unconfirmed = [c for c in rising if c not in phase_still and not confirmed]
    counted = [c for c in rising if c not in phase_still and c not in unconfirmed]
    gate = Gate(
        expression,
        "new_high",
        float(diff.base.findings.get("high", 0)),
        float(diff.test.findings.get("high", 0)),
        None,
        len(counted) > number,
    )
    reasons = []
    if counted:
        reasons.append(
            f"{len(counted)} finding(s) became HIGH: " + ", ".join(_finding_text(c) for c in counted)
        )
    if phase_still:
        reasons.append(
            ", ".join(
                f"{_finding_text(c)} with {PHASE_LABELS.get(c.phase or '', c.phase)}" for c in phase_still
            )
            + " became HIGH, but the phase shows no significant change: not counted"
        )
    if unconfirmed:
        reasons.append(
            ", ".join(_finding_text(c) for c in unconfirmed)
            + " became HIGH in the profiled window, but the step time over the plain steps shows no significant "
            "growth: not counted"
        )
    gate.reason = "; ".join(reasons) or "no finding became HIGH"
    gate.outcome = "breach" if gate.breached else "pass"
    if counted:
        gate.ranks = sorted({r for c in counted for r in (c.ranks or ([] if c.rank is None else [c.rank]))})
        gate.rank = gate.ranks[0] if len(gate.ranks) == 1 else None
    return gate


def _finding_text(c: FindingChange) -> str:
    where = "" if c.rank is None else f" rank {c.rank}"
    was = "new" if c.base_severity is None else f"was {c.base_severity.upper()}"
    return f"{c.id}{where} ({was})"
