"""Words for a Diff shared by the terminal report (report/terminal/diff.py) and the compare page (report/html/compare.py):
which steps were compared, a change with its interval, a finding's change in one line."""

from __future__ import annotations

from stepscope.analysis.diff.compare import PHASE_LABELS, FindingChange
from stepscope.analysis.diff.steps import StepComparison, StepSample, step_ranges
from stepscope.units import fmt_ms, list_ranks


def sample_text(s: StepSample) -> str:
    """'34 plain steps: 1-4, 10-39 (rank 0)'."""
    what = "plain steps" if s.source == "plain" else "profiled steps"
    ranks = list_ranks(s.ranks).replace(", ", ",")
    who = f"rank {ranks}" if len(s.ranks) == 1 else f"ranks {ranks}" if s.ranks else "no rank"
    values = "" if s.values == len(s.steps) else f"; {s.values} step times"
    return f"{len(s.steps)} {what}: {step_ranges(s.steps) or 'none'} ({who}{values})"


def quartiles_text(s: StepSample) -> str:
    return "-" if s.q1_ms is None else f"{fmt_ms(s.q1_ms)} to {fmt_ms(s.q3_ms)}"


def change_text(delta: float | None, low: float | None, high: float | None, pct: float | None) -> str:
    """'+1.20 ms (+5.1%), 95% interval +0.80 ms to +1.60 ms: significant'."""
    if delta is None:
        return "- (a run has no step times)"
    share = f" ({pct:+.1f}%)" if pct is not None else ""
    if low is None or high is None:
        return f"{signed_ms(delta)}{share}; too few values for a 95% interval"
    verdict = "significant" if low > 0 or high < 0 else "no significant change (the interval holds 0)"
    return f"{signed_ms(delta)}{share}, 95% interval {signed_ms(low)} to {signed_ms(high)}: {verdict}"


def fast_change_text(st: StepComparison) -> str:
    """The change of the fast steps (10th percentile), as change_text."""
    pct = (
        100.0 * st.fast_delta_ms / st.base.fast_ms
        if st.fast_delta_ms is not None and st.base.fast_ms
        else None
    )
    return change_text(st.fast_delta_ms, st.fast_low_ms, st.fast_high_ms, pct)


def signed_ms(ms: float) -> str:
    return ("+" if ms > 0 else "") + fmt_ms(ms) if ms else "0"


def finding_head(f: FindingChange) -> str:
    """'new rank 0 HIGH comm_bound, 3.10 ms per step', 'changed rank 0 data_loader_stall: MEDIUM -> HIGH, ...'."""
    where = "" if f.rank is None else f" rank {f.rank}"
    if len(f.ranks) > 1:
        where = " ranks " + list_ranks(f.ranks).replace(", ", ",")
    if f.status == "appeared":
        price = f", {fmt_ms(f.test_cost_ms)} per step" if f.test_cost_ms is not None else ""
        head = f"new{where} {f.severity.upper()} {f.id}{price}"
    elif f.status == "disappeared":
        price = f", was {fmt_ms(f.base_cost_ms)} per step" if f.base_cost_ms is not None else ""
        head = f"gone{where} {f.severity.upper()} {f.id}{price}"
    else:
        severity = (
            f"{(f.base_severity or '').upper()} -> {f.severity.upper()}, "
            if f.base_severity != f.severity
            else f"{f.severity.upper()}, "
        )
        head = (
            f"changed{where} {f.id}: {severity}{fmt_ms(f.base_cost_ms)} -> {fmt_ms(f.test_cost_ms)} per step"
        )
    if f.phase is not None and f.phase_significant is False:
        head += f" ({PHASE_LABELS.get(f.phase, f.phase)} itself: change not significant)"
    return head
