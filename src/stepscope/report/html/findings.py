"""The report's findings, as the page lists them, and the section of the report that shows each one's evidence."""

from __future__ import annotations

from typing import Any

from stepscope.analysis.findings import Finding, section_of
from stepscope.report._savings import saving_text
from stepscope.report.data import ReportData
from stepscope.report.model import SECTION_TITLES
from stepscope.units import fmt_ms, fmt_pct, fmt_ranks


def finding_section(f: Finding) -> str:
    """The id of the section that shows `f`'s evidence: the one its rule declares (findings/registry.py)."""
    section = section_of(f.id)
    return section if section in SECTION_TITLES else "overview"


def findings(data: ReportData) -> list[dict[str, Any]]:
    out = []
    for f in data.analysis.findings:
        evidence = {k: v for k, v in f.evidence.items() if k != "arithmetic"}
        out.append(
            {
                "severity": f.severity,
                "id": f.id,
                "rank": f.rank,
                "ranks": fmt_ranks(f.ranks) if len(f.ranks) > 1 else "",
                "across": _across(f) if len(f.ranks) > 1 else "",
                "cost": fmt_ms(f.cost_ms_per_step) + " per step" if f.cost_ms_per_step is not None else "",
                "pct": fmt_pct(f.pct_of_step) + " of the step" if f.pct_of_step is not None else "",
                "saving": saving_text(f),
                "saving_note": f.saving_note,
                "message": f.message,
                "action": f.action,
                "arithmetic": f.evidence.get("arithmetic") or "",
                "evidence": [(k, _plain(v)) for k, v in evidence.items()],
                "section": finding_section(f),
            }
        )
    return out


def _across(f: Finding) -> str:
    """A finding on several ranks: its spread, and whose figures the message gives."""
    spread = f.cost_range_ms_per_step
    cost = (
        f"{fmt_ms(spread[0])} to {fmt_ms(spread[1])} per step across ranks {fmt_ranks(f.ranks)}; "
        if spread
        else ""
    )
    return f"{cost}the figures are rank {f.rank}'s" + (", the costliest" if spread else "")


def _plain(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "-" if value is None else str(value)
