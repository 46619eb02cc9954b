"""Findings: families of rules that turn analyses into problems priced in step time, with evidence and one action;
each rule declares its id, report section and what its price measures (registry.py).

The names below are this package's public API, imported on first use (importing the package costs nothing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stepscope._lazy import lazy_exports

if TYPE_CHECKING:
    from stepscope.analysis.findings.comm import comm_findings
    from stepscope.analysis.findings.groups import group_across_ranks
    from stepscope.analysis.findings.pipeline import pipeline_findings
    from stepscope.analysis.findings.pricing import Evidence, Finding
    from stepscope.analysis.findings.registry import all_rules, section_of
    from stepscope.analysis.findings.replayed import ReplaySavings, price_by_replay
    from stepscope.analysis.findings.rule import Rule
    from stepscope.analysis.findings.rules import group_label, rank_by_cost, rank_findings, straggler_findings

_EXPORTS = {
    "Finding": "pricing",
    "Evidence": "pricing",
    "Rule": "rule",
    "all_rules": "registry",
    "section_of": "registry",
    "rank_findings": "rules",
    "rank_by_cost": "rules",
    "straggler_findings": "rules",
    "group_label": "rules",
    "comm_findings": "comm",
    "group_across_ranks": "groups",
    "pipeline_findings": "pipeline",
    "ReplaySavings": "replayed",
    "price_by_replay": "replayed",
}

__all__ = [
    "Evidence",
    "Finding",
    "ReplaySavings",
    "Rule",
    "all_rules",
    "comm_findings",
    "group_across_ranks",
    "group_label",
    "pipeline_findings",
    "price_by_replay",
    "rank_by_cost",
    "rank_findings",
    "section_of",
    "straggler_findings",
]


__getattr__ = lazy_exports(__name__, _EXPORTS)
