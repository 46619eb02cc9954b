"""One finding per problem, not one per rank: a finding that holds on several ranks at a similar cost is one finding
that names the ranks and the spread of its cost (docs/analysis.md, "Findings").

Findings group by id (and, for `collective_slow`, the kind of collective). Priced findings are similar when the
cheapest costs at least 1 / SIMILAR_COST_RATIO of the costliest; info findings when each of their per-step
figures lies within SIMILAR_SHARE_POINTS of the step of the other. A group is the costliest rank's finding as it is
(its message, evidence and price: `rank` is that rank), with `ranks` and `cost_range_ms_per_step` filled in.
"""

from __future__ import annotations

import msgspec

from stepscope.analysis.findings.pricing import Finding

SIMILAR_COST_RATIO = 2.0
SIMILAR_SHARE_POINTS = 10.0
# never grouped: a finding about one rank by its nature
ONE_RANK_IDS = frozenset({"straggler"})


def group_across_ranks(findings: list[Finding]) -> list[Finding]:
    """`findings` of every rank, with those that hold on several ranks at a similar cost made one."""
    by_key: dict[tuple[str, str], list[Finding]] = {}
    out: list[Finding] = []
    for f in findings:
        if f.rank is None or f.id in ONE_RANK_IDS:
            out.append(msgspec.structs.replace(f, ranks=[] if f.rank is None else [f.rank]))
        else:
            by_key.setdefault((f.id, str(f.evidence.get("kind") or "")), []).append(f)
    for same in by_key.values():
        out.extend(_grouped(group) for group in _groups(same))
    return out


def _groups(same: list[Finding]) -> list[list[Finding]]:
    """The findings of one id cut into groups of similar ones, each led by its costliest (else lowest) rank."""
    rest = sorted(same, key=lambda f: (-(f.cost_ms_per_step or 0.0), f.rank or 0))
    groups = []
    while rest:
        head = rest[0]
        group = [f for f in rest if f is head or _similar(head, f)]
        groups.append(group)
        taken = {id(g) for g in group}
        rest = [f for f in rest if id(f) not in taken]
    return groups


def _similar(head: Finding, other: Finding) -> bool:
    if head.cost_ms_per_step is not None and other.cost_ms_per_step is not None:
        return other.cost_ms_per_step * SIMILAR_COST_RATIO >= head.cost_ms_per_step
    if head.cost_ms_per_step is not None or other.cost_ms_per_step is not None:
        return False
    step = max(_number(head.evidence.get("step_ms")) or 0.0, _number(other.evidence.get("step_ms")) or 0.0)
    for key, value in head.evidence.items():
        if not key.endswith("_ms_per_step"):
            continue
        a, b = _number(value), _number(other.evidence.get(key))
        if (a is None) != (b is None):
            return False
        if a is not None and b is not None and abs(a - b) > SIMILAR_SHARE_POINTS / 100 * step:
            return False
    return True


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def _grouped(group: list[Finding]) -> Finding:
    head = group[0]
    ranks = sorted(f.rank for f in group if f.rank is not None)
    costs = [f.cost_ms_per_step for f in group if f.cost_ms_per_step is not None]
    spread = [min(costs), max(costs)] if len(ranks) > 1 and costs else None
    return msgspec.structs.replace(head, ranks=ranks, cost_range_ms_per_step=spread)
