"""Rules about FSDP on one rank: all-gathers the step waits for (`fsdp_exposed_all_gather`)."""

from __future__ import annotations

import numpy as np

from stepscope.analysis.findings._common import code_name, fmt_p
from stepscope.analysis.findings.pricing import Finding, Price, WindowSteps, priced
from stepscope.analysis.findings.rule import Rule
from stepscope.analysis.per_rank.parallelism.fsdp import FsdpRank, FsdpUnit
from stepscope.analysis.per_rank.prepare import RankData
from stepscope.analysis.stats import median
from stepscope.units import fmt_bytes, fmt_ms

FSDP_EXPOSED_ALL_GATHER = Rule(
    "fsdp_exposed_all_gather", "parallelism", "the FSDP all-gather time no computation hides"
)
RULES = (FSDP_EXPOSED_ALL_GATHER,)

# fsdp_exposed_all_gather: the all-gathers the rank's work does not hide take at least this share of the step.
FSDP_EXPOSED_MIN_PCT = 5.0


# ... and the action: at least this many units whose all-gathers average under SMALL_ALL_GATHER_BYTES each
# (per-collective latency dominates): fewer, larger units.
MANY_UNITS = 8


SMALL_ALL_GATHER_BYTES = 1 << 20


# units named in the message and the evidence
TOP_UNITS = 3


def fsdp_findings(data: RankData, fsdp: FsdpRank) -> list[Finding]:
    """The FSDP rules of one rank."""
    found = exposed_all_gather(data, fsdp)
    return [found] if found is not None else []


def exposed_all_gather(data: RankData, fsdp: FsdpRank) -> Finding | None:
    steps = WindowSteps.of(data)
    per_step = [s.exposed_all_gather_ms for s in fsdp.steps]
    if not fsdp.steps or any(v is None for v in per_step) or len(per_step) != len(steps):
        return None
    cost = np.array([round((v or 0.0) * 1e6) for v in per_step], dtype=np.int64)
    price = Price(np.minimum(cost, steps.length), steps, FSDP_EXPOSED_MIN_PCT)
    units = sorted(
        (u for u in fsdp.units if (u.exposed_all_gather_ms_per_step or 0.0) > 0),
        key=lambda u: -(u.exposed_all_gather_ms_per_step or 0.0),
    )
    top = units[:TOP_UNITS]
    forward = median([s.exposed_forward_ms or 0.0 for s in fsdp.steps])
    backward = median([s.exposed_backward_ms or 0.0 for s in fsdp.steps])
    total = median([s.all_gather_ms or 0.0 for s in fsdp.steps])
    named = ", ".join(f"`{code_name(u.unit)}` {fmt_ms(u.exposed_all_gather_ms_per_step or 0.0)}" for u in top)
    action = _action(fsdp, top, forward, backward)
    evidence: dict[str, float | int | str | None] = {
        "all_gather_ms_per_step": round(total, 3),
        "exposed_forward_ms_per_step": round(forward, 3),
        "exposed_backward_ms_per_step": round(backward, 3),
        "units": len(fsdp.units),
        "version": fsdp.version,
    }
    for i, unit in enumerate(top):
        evidence[f"unit_{i + 1}"] = unit.unit
        evidence[f"unit_{i + 1}_exposed_ms_per_step"] = unit.exposed_all_gather_ms_per_step
    shown = f"{fmt_p(100 * price.cost_ms / total)} " if total > 0 else ""
    return priced(
        FSDP_EXPOSED_ALL_GATHER.id,
        data.rank,
        price,
        "FSDP all-gather time in which the rank does not compute",
        f"The step waits {fmt_ms(price.ms)} per step ({fmt_p(price.pct)} of the step) for FSDP all-gathers: "
        f"{shown}of their {fmt_ms(total)} per step is not hidden ({fmt_ms(forward)} in forward, "
        f"{fmt_ms(backward)} in backward); most in units {named}",
        action,
        evidence,
    )


def _action(fsdp: FsdpRank, top: list[FsdpUnit], forward: float, backward: float) -> str:
    """One action, chosen by where the exposed time is (the rule's row in docs/analysis.md)."""
    sizes = [
        (u.all_gather_bytes_per_step or 0.0) / u.all_gathers_per_step
        for u in fsdp.units
        if u.all_gathers_per_step and u.all_gather_bytes_per_step is not None
    ]
    if len(fsdp.units) >= MANY_UNITS and sizes and median(sizes) < SMALL_ALL_GATHER_BYTES:
        return (
            f"wrap fewer, larger units: {len(fsdp.units)} units gather {fmt_bytes(median(sizes))} each "
            "(median), too little to amortise each collective's latency"
        )
    regather = [u.unit for u in top if u.all_gathers_per_step >= 2]
    if backward > forward and regather:
        names = ", ".join(f"`{code_name(n)}`" for n in regather)
        setting = "reshard_after_forward=False" if fsdp.version == 2 else "ShardingStrategy.SHARD_GRAD_OP"
        return (
            f"keep {names} gathered from forward to backward ({setting} for them), so backward does not "
            "gather them again, at the cost of their unsharded parameters' memory"
        )
    if fsdp.version == 2:
        return (
            "prefetch the next unit's all-gather while this one computes (set_modules_to_forward_prefetch / "
            "set_modules_to_backward_prefetch, or more units in flight)"
        )
    return "prefetch the next unit's all-gather (forward_prefetch=True, backward_prefetch=BACKWARD_PRE)"
