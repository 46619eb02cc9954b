"""Every finding a rule can raise: its id, the report section that shows its evidence, and what its price
measures. Each family of rules declares its own (`RULES` in gpu_idle.py, comm_rank.py, cpu_only.py, comm.py,
expert.py, fsdp.py, pipeline.py, rules.py,
python.py and anomaly.py); `all_rules()` gathers them, and the report asks `section_of` where a finding's evidence is shown."""

from __future__ import annotations

from functools import cache

from stepscope.analysis.findings import (
    anomaly,
    comm,
    comm_rank,
    cpu_only,
    expert,
    fsdp,
    gpu_idle,
    pipeline,
    python,
    rules,
)
from stepscope.analysis.findings.rule import Rule

__all__ = ["Rule", "all_rules", "section_of"]

DEFAULT_SECTION = "overview"


@cache
def all_rules() -> dict[str, Rule]:
    """Every rule of every family, by id."""
    out: dict[str, Rule] = {}
    for family in (gpu_idle, comm_rank, cpu_only, comm, expert, fsdp, pipeline, rules, python, anomaly):
        for rule in family.RULES:
            if out.setdefault(rule.id, rule) is not rule:
                raise ValueError(f"finding id {rule.id!r} declared twice")
    return out


def section_of(finding_id: str) -> str:
    """The report section that shows the evidence of findings with this id."""
    rule = all_rules().get(finding_id)
    return rule.section if rule is not None else DEFAULT_SECTION
