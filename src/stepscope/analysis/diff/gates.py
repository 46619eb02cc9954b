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

from stepscope.analysis.diff.compare import PHASE_LABELS, PHASES, Diff, FindingChange, Gate

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


def _time_gate(diff: Diff, expression: str, metric: str, op: str, number: float, unit: str | None) -> Gate:
    label = PHASE_LABELS.get(metric, metric)
    if metric == "step_time":
        st = diff.step_time
        base, test = st.base.median_ms, st.test.median_ms
        delta, low, high, counts = st.delta_ms, st.low_ms, st.high_ms, (st.base.values, st.test.values)
    else:
        phase = next((p for p in diff.phases if p.name == metric), None)
        base, test = (phase.base_ms, phase.test_ms) if phase else (None, None)
        delta, low, high = (phase.delta_ms, phase.low_ms, phase.high_ms) if phase else (None, None, None)
        counts = (phase.base_values, phase.test_values) if phase else (0, 0)
    gate = Gate(expression, metric, base, test, None, False, delta, low, high)
    if base is None or test is None or delta is None:
        gate.reason = f"the runs do not both show {label}; not checked"
        return gate
    gate.change_pct = round(100.0 * delta / base, 2) if base else None
    limit = base * number / 100 if unit == "%" else number * _UNIT_MS[unit or "ms"]
    if low is None or high is None:
        more = "more active steps" if metric != "step_time" else "run folders with more plain steps"
        gate.reason = (
            f"{counts[0]} and {counts[1]} values are too few to bound the change at 95% ({more}); not checked"
        )
        return gate
    change = _change_text(delta, low, high, base if unit == "%" else None)
    bound = f"{'+' if op == '>' else '-'}{number:g}{unit}"
    grew = op == ">"
    if not (low > 0 or high < 0):
        gate.reason = f"{label} {change}: the interval holds 0, no significant change"
    elif not (low > limit if grew else high < -limit):
        may = (delta > limit) if grew else (delta < -limit)
        gate.reason = f"{label} {change}: {'may be' if may else 'significant,'} within {bound}"
    elif metric == "step_time" and not _fast_steps_beyond(diff, grew, number, unit):
        st = diff.step_time
        assert st.fast_delta_ms is not None and st.fast_low_ms is not None and st.fast_high_ms is not None
        fast = _change_text(
            st.fast_delta_ms, st.fast_low_ms, st.fast_high_ms, st.base.fast_ms if unit == "%" else None
        )
        gate.reason = (
            f"{label} {change}, but its fast steps (10th percentile) moved {fast}: more of the steps were slow, "
            f"not every step (a busier machine, or a cost on some steps only); not beyond {bound}"
        )
    elif metric != "step_time" and not _step_time_confirms(
        diff, grew, (low if grew else high) / WINDOW_SLACK
    ):
        gate.reason = (
            f"{label} {change} in the profiled window, but the step time over the plain steps does not move "
            f"that much, significantly, the same way: not confirmed, not breached"
        )
    elif metric != "step_time" and not _beyond_the_step(diff, grew, low, high, base, limit):
        scaled = 100.0 * _step_ratio(diff, grew)
        gate.reason = (
            f"{label} {change}, but the whole step moved {scaled:+.1f}% (plain steps' median): beyond that, the "
            f"phase's change may be within {bound}"
        )
    else:
        gate.breached = True
        gate.reason = f"{label} {change}: beyond {bound}"
    return gate


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
    return gate


def _finding_text(c: FindingChange) -> str:
    where = "" if c.rank is None else f" rank {c.rank}"
    was = "new" if c.base_severity is None else f"was {c.base_severity.upper()}"
    return f"{c.id}{where} ({was})"
