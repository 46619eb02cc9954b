"""A finding per window the watch opened by itself (analysis/run/anomaly.py): what slowed the steps it recorded,
priced as the extra time of a slow step against the run's plain window, first among the findings."""

from __future__ import annotations

from collections.abc import Sequence

from stepscope.analysis.findings.pricing import Evidence, Finding
from stepscope.analysis.findings.rule import Rule
from stepscope.analysis.run.anomaly import PHASE_WORDS, AnomalyWindow

ANOMALY_WINDOW = Rule(
    "anomaly_window",
    "anomalies",
    "the extra time of a slow step of a window the watch opened, over the run's plain window (per slow step)",
)
RULES = (ANOMALY_WINDOW,)

HIGH_FACTOR = 2.0  # a slow step at twice the plain one or more


def anomaly_findings(windows: Sequence[AnomalyWindow]) -> list[Finding]:
    """One finding per compared window with slow steps, the newest first."""
    out = []
    for window in reversed(windows):
        if window.extra_ms is None or window.factor is None:
            continue
        cause = window.cause_ranks[0] if window.cause_ranks else None
        evidence: Evidence = {
            "window": f"{window.first}-{window.last}",
            "reference_window": None
            if window.reference is None
            else f"{window.reference[0]}-{window.reference[1]}",
            "slow_steps": ", ".join(map(str, window.slow_steps)),
            "factor": window.factor,
            "extra_ms_per_slow_step": window.extra_ms,
            "cause_phase": window.cause_phase,
            "cause_ms_per_slow_step": window.cause_ms,
            "cause_share_pct": window.cause_share_pct,
            "waited": ", ".join(map(str, window.waited)) or None,
            "watch": window.why,
            "arithmetic": window.check,
        }
        if window.cause_phase is not None and cause is not None:
            action = (
                f"look at rank {cause}'s {PHASE_WORDS[window.cause_phase]} in steps {window.first}-{window.last} "
                f"(its trace, and what the job did then)"
            )
        else:
            action = f"look at the collectives of steps {window.first}-{window.last} on every rank"
        slow = next((r.slow_ms for r in window.ranks if r.rank == cause), None) if cause is not None else None
        slow = slow if slow is not None else max((r.slow_ms for r in window.ranks), default=0.0)
        out.append(
            Finding(
                id=ANOMALY_WINDOW.id,
                severity="high" if window.factor >= HIGH_FACTOR else "medium",
                rank=cause,
                message=window.message,
                evidence=evidence,
                cost_ms_per_step=window.extra_ms,
                pct_of_step=round(100.0 * window.extra_ms / slow, 1) if slow else None,
                action=action,
                steps_held=len(window.slow_steps),
                steps=window.last - window.first + 1,
                ranks=list(window.cause_ranks),
                saving_ms_per_step=window.extra_ms,
                saving_from="rule",
                saving_note=(
                    "per slow step, not per step of the run: the slow steps' extra time over the plain window "
                    f"{'' if window.reference is None else f'{window.reference[0]}-{window.reference[1]} '}"
                    "(the median over ranks); both windows ran under the profiler, whose overhead cancels"
                ),
            )
        )
    return out


__all__ = ["ANOMALY_WINDOW", "RULES", "anomaly_findings"]
