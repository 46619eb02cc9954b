"""Findings: rules that turn the numbers of one rank (or of all ranks) into advice, each priced in step time.

Every finding says what it costs the step: `cost_ms_per_step` is the time fixing it would save (an upper bound:
the GPU or the other ranks wait for exactly that long), measured in each step of the window and priced by the
median step; `pct_of_step` is the same as a share of the median step, and `evidence["arithmetic"]` shows how the
figure was reached. Severity follows the price (SEVERITY_PCT), but a finding that holds in at most half of the
steps is LOW and says in how many (pricing.py). INFO findings carry no price.

The rules come in families, each a module that declares its findings (`RULES`: id, report section, what the
price measures; registry.py gathers them): the GPU's idle time (gpu_idle.py), one rank's communication
(comm_rank.py), ranks without GPU activity (cpu_only.py), the collectives of all ranks together (comm.py), and
the straggler (here). `rank_findings` runs the families of one rank; one finding per problem across ranks:
groups.py. Every threshold is a named constant of its family, documented in docs/analysis.md ("Findings").
"""

from __future__ import annotations

import numpy as np

from stepscope.analysis import intervals as iv
from stepscope.analysis.cross_rank.straggler import GroupStraggler
from stepscope.analysis.findings._common import code_name, fmt_p
from stepscope.analysis.findings.comm_rank import comm_bound, poor_overlap
from stepscope.analysis.findings.cpu_only import cpu_only
from stepscope.analysis.findings.gpu_idle import (
    data_loader_stall,
    host_waits,
    idle_gaps,
    pageable_copies,
    sync_points,
    tiny_kernels,
)
from stepscope.analysis.findings.pricing import (
    FINDING_MIN_NS_PER_STEP,
    FINDING_MIN_PCT,
    SEVERITY_PCT,
    Evidence,
    Finding,
    severity_of,
)
from stepscope.analysis.findings.replayed import priced_by_rule
from stepscope.analysis.findings.rule import Rule
from stepscope.analysis.per_rank import host
from stepscope.analysis.per_rank.breakdown import Temporal
from stepscope.analysis.per_rank.overlap import CommOverlap
from stepscope.analysis.per_rank.prepare import RankData
from stepscope.units import fmt_members, fmt_ms, list_ranks

__all__ = [
    "FINDING_MIN_NS_PER_STEP",
    "FINDING_MIN_PCT",
    "SEVERITY_PCT",
    "Evidence",
    "Finding",
    "group_label",
    "rank_by_cost",
    "rank_findings",
    "severity_of",
    "straggler_findings",
]

STRAGGLER = Rule("straggler", "ranks", "the time the other ranks wait for the slowest")
RULES = (STRAGGLER,)


def rank_findings(
    data: RankData,
    temporal: Temporal | None,
    overlap: CommOverlap | None,
    comm: iv.Intervals | None = None,
) -> list[Finding]:
    """Every rule that applies to one rank. `comm`: the rank's time in communication, a union
    (collectives.communication_intervals)."""
    out: list[Finding] = []
    gaps = idle_gaps(data)
    loader = host.phase_unions(data.table, data.lo, data.hi)["data_loader"]
    syncs, sync_idle = sync_points(data, gaps)
    claimed = _union(loader, sync_idle)
    exposed = comm_bound(data, temporal, overlap)
    for found in (
        data_loader_stall(data, gaps, loader),
        syncs,
        host_waits(data, gaps, claimed),
        tiny_kernels(data, gaps),
        exposed,
        poor_overlap(data, temporal, overlap, exposed),
        pageable_copies(data),
    ):
        if found is not None:
            out.append(found)
    if len(data.gpu_all) == 0:
        out.extend(cpu_only(data, loader, comm))
    return out


def _union(a: iv.Intervals, b: iv.Intervals) -> iv.Intervals:
    return iv.merge(np.r_[a[0], b[0]], np.r_[a[1], b[1]])


def rank_by_cost(findings: list[Finding]) -> list[Finding]:
    """Priced findings by what fixing them saves per step (largest first; a finding no replay priced saves its
    rule's price: replayed.priced_by_rule), then by their rule's price, then info ones; ties by rank and id."""
    return sorted(
        priced_by_rule(findings),
        key=lambda f: (
            f.cost_ms_per_step is None,
            -(f.saving_ms_per_step or 0.0),
            -(f.cost_ms_per_step or 0.0),
            f.rank if f.rank is not None else -1,
            f.id,
        ),
    )


def straggler_findings(stragglers: list[GroupStraggler]) -> list[Finding]:
    """One finding per rank whose own lateness holds a process group back (straggler.py decides which stand
    out), naming its groups and the ranks that pass its lateness on to their other groups (directly or
    through others: `root_rank`)."""
    own: dict[int, list[GroupStraggler]] = {}
    for g in stragglers:  # (largest delay first)
        if g.waits_for is None:
            own.setdefault(g.rank, []).append(g)
    return [
        _straggler_finding(held, [g for g in stragglers if g.waits_for and g.root_rank == rank])
        for rank, held in own.items()
    ]


def group_label(group: str | None, dim: str | None, ranks: list[int]) -> str:
    """A process group as the findings and the report name it: "tp group {2, 3}"."""
    members = fmt_members(ranks)
    if group is None:
        return f"process group (unknown: the traces name none; ranks {members})"
    return f"{dim} group {members}" if dim else f"process group {group} {members}"


def _straggler_finding(held: list[GroupStraggler], passed: list[GroupStraggler]) -> Finding:
    """The finding of one rank: `held`, the groups it holds back, largest delay first; `passed`, the groups
    in which a rank that waits for it arrives last in turn."""
    top = held[0]
    cause = top.cause
    why = ""
    if cause is not None:
        what = {"data_loader": "data loading", "op": f"`{code_name(cause.name or '')}`"}.get(
            cause.phase, cause.phase
        )
        why = (
            f": its {what} takes {fmt_ms(cause.rank_ms_per_step)} per step against "
            f"{fmt_ms(cause.others_ms_per_step)} on the other ranks"
        )
        if cause.phase == "outside_regions":
            why = (
                f": its steps less the waiting take {fmt_ms(cause.rank_ms_per_step)} against "
                f"{fmt_ms(cause.others_ms_per_step)} on the other ranks, and no annotated region or op accounts "
                "for the difference (Python code, sleeps, I/O)"
            )
    action = {
        "data_loader": "give its DataLoader more workers or faster storage",
        "forward": "balance the work of the forward pass (uneven shards, sequence lengths or experts)",
        "backward": "balance the work of the backward pass",
        "optimizer": "balance the optimizer's work (sharded state, uneven parameter groups)",
    }.get(cause.phase if cause else "", "find what that rank does differently (host, data, work)")
    share = top.delay_pct
    also = "".join(
        f"; it holds its {group_label(g.group, g.dim, g.ranks)} back {fmt_ms(g.delay_ms_per_step)} per step"
        for g in held[1:]
    )
    on = "".join(
        f"; rank {g.rank}, which waits for it{_through(g, top.rank)}, then arrives last in its {group_label(g.group, g.dim, g.ranks)} "
        f"and holds it back {fmt_ms(g.delay_ms_per_step)} per step"
        for g in passed
    )
    return Finding(
        STRAGGLER.id,
        severity_of(share) or "low",
        top.rank,
        f"Rank {top.rank} holds its {group_label(top.group, top.dim, top.ranks)} back: it arrives last at the "
        f"group's collectives and the other ranks of it wait {fmt_ms(top.delay_ms_per_step)} per step "
        f"({fmt_p(share)} of the step){why}{also}{on}; {action}.",
        {
            "group": top.group,
            "dim": top.dim,
            "group_ranks": list_ranks(top.ranks),
            "last_in_steps": top.last_in_steps,
            "steps": top.steps,
            "cause": cause.phase if cause else None,
            "cause_name": cause.name if cause else None,
            "cause_rank_ms_per_step": cause.rank_ms_per_step if cause else None,
            "cause_others_ms_per_step": cause.others_ms_per_step if cause else None,
            "groups": "; ".join(_held_evidence(g) for g in held),
            "passed_on": "; ".join(_held_evidence(g) for g in passed) or None,
            "arithmetic": f"the other ranks of its {group_label(top.group, top.dim, top.ranks)} wait for it "
            f"{top.delay_ms_per_step:.3f} ms per step (each one's waits at the group's collectives it arrives "
            f"last at, a union in time, averaged over those ranks and {top.steps} matched steps); {share:.1f}% "
            "of their mean step",
        },
        cost_ms_per_step=round(top.delay_ms_per_step, 3),
        pct_of_step=round(share, 2),
        action=action,
    )


def _through(g: GroupStraggler, root: int) -> str:
    w = g.waits_for
    return f" (through rank {w.rank})" if w is not None and w.rank != root else ""


def _held_evidence(g: GroupStraggler) -> str:
    """ "rank 3 holds tp group {2, 3} 38.062 ms per step"."""
    return f"rank {g.rank} holds {group_label(g.group, g.dim, g.ranks)} {g.delay_ms_per_step:.3f} ms per step"
