"""`--fail-on` gates of `stepscope diff`: parse `METRIC>+N%` and friends, and decide each against a Diff.

A gate on a time breaches only on a change that is both significant (its 95% interval excludes zero, see
_shift.py) and beyond the gate's threshold: the runs' own spread decides what is noise, the threshold what
matters. With too few values to bound the change the gate is not checked, and says so. `new_high>N` counts the
findings that are HIGH in TEST but were not HIGH in BASE (new, or escalated from a lower severity), except one
whose own phase (diff.FINDING_PHASES) the runs show with no significant change: its share of the step moved, or
one disturbed step of the window carries it, not its time.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from stepscope.analysis.diff import PHASE_LABELS, PHASES, Diff, FindingChange, Gate

GATE_RE = re.compile(r"^\s*([a-z_]+)\s*([<>])\s*([+-]?\d+(?:\.\d+)?)\s*(%|ms|us|s)?\s*$")
# step_time: the plain steps of run folders (diff_steps.py); the rest: the profiled window's phases
GATE_METRICS = ("step_time", *(p for p in PHASES if p != "profiled_step"), "new_high")
_UNIT_MS = {"ms": 1.0, "us": 1e-3, "s": 1e3}


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
        gate.reason = (
            f"{counts[0]} and {counts[1]} values are too few to bound the change at 95%; not checked"
        )
        return gate
    change = _change_text(delta, low, high, base if unit == "%" else None)
    bound = f"{'+' if op == '>' else '-'}{number:g}{unit}"
    beyond = delta > limit if op == ">" else delta < -limit
    significant = low > 0 if op == ">" else high < 0
    gate.breached = beyond and significant
    if gate.breached:
        gate.reason = f"{label} {change}: significant and beyond {bound}"
    elif not (low > 0 or high < 0):
        gate.reason = f"{label} {change}: the interval holds 0, no significant change"
    else:
        gate.reason = f"{label} {change}: significant, within {bound}"
    return gate


def _change_text(delta: float, low: float, high: float, base: float | None) -> str:
    """'+23.0% (95%: +18.1% to +27.9%)' against `base`, or '+1.20 ms (95%: ...)' without one."""
    from stepscope.units import fmt_ms

    def show(ms: float) -> str:
        if base:
            return f"{100.0 * ms / base:+.1f}%"
        return ("+" if ms > 0 else "") + fmt_ms(ms) if ms else "0"

    return f"{show(delta)} (95%: {show(low)} to {show(high)})"


def became_high(diff: Diff) -> tuple[list[FindingChange], list[FindingChange]]:
    """(counted, left out): the findings HIGH in test that were not HIGH in base (new, or escalated); left out
    when the phase the finding measures shows no significant change."""
    rising = [
        c
        for c in diff.findings
        if c.severity == "high"
        and (c.status == "appeared" or (c.status == "changed" and c.base_severity != "high"))
    ]
    return [c for c in rising if c.phase_significant is not False], [
        c for c in rising if c.phase_significant is False
    ]


def _new_high(diff: Diff, expression: str, number: float) -> Gate:
    counted, left_out = became_high(diff)
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
    if left_out:
        reasons.append(
            ", ".join(f"{_finding_text(c)} with {PHASE_LABELS.get(c.phase or '', c.phase)}" for c in left_out)
            + " became HIGH, but the phase shows no significant change: not counted"
        )
    if not reasons:
        reasons.append("no finding became HIGH")
    gate.reason = "; ".join(reasons)
    return gate


def _finding_text(c: FindingChange) -> str:
    where = "" if c.rank is None else f" rank {c.rank}"
    was = "new" if c.base_severity is None else f"was {c.base_severity.upper()}"
    return f"{c.id}{where} ({was})"
