"""Findings: families of rules that turn analyses into problems priced in step time, with evidence and one action;
each rule declares its id, report section and what its price measures (registry.py).

The names below are this package's public API, imported on first use (importing the package costs nothing).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stepscope.analysis.findings.comm import comm_findings
    from stepscope.analysis.findings.groups import group_across_ranks
    from stepscope.analysis.findings.pricing import Evidence, Finding
    from stepscope.analysis.findings.registry import Rule, all_rules, section_of
    from stepscope.analysis.findings.rules import rank_by_cost, rank_findings, straggler_finding

_EXPORTS = {
    "Finding": "pricing",
    "Evidence": "pricing",
    "Rule": "registry",
    "all_rules": "registry",
    "section_of": "registry",
    "rank_findings": "rules",
    "rank_by_cost": "rules",
    "straggler_finding": "rules",
    "comm_findings": "comm",
    "group_across_ranks": "groups",
}

__all__ = [
    "Evidence",
    "Finding",
    "Rule",
    "all_rules",
    "comm_findings",
    "group_across_ranks",
    "rank_by_cost",
    "rank_findings",
    "section_of",
    "straggler_finding",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
