"""Rules for ranks without GPU activity: Python overhead, the optimizer, many small ops, and the step's breakdown."""

from __future__ import annotations

import msgspec
import numpy as np

from stepscope.analysis import intervals as iv
from stepscope.analysis.findings._common import (
    OUTSIDE_OPS_MIN_SHARE,
    PHASE_ACTIONS,
    all_of,
    code_name,
    fmt_p,
    ms,
    python_action,
)
from stepscope.analysis.findings.pricing import (
    Evidence,
    Finding,
    WindowSteps,
    price_of,
    priced,
)
from stepscope.analysis.findings.rule import Rule
from stepscope.analysis.per_rank import host
from stepscope.analysis.per_rank.prepare import RankData
from stepscope.units import fmt_ms, fmt_ns

PYTHON_OVERHEAD = Rule("python_overhead", "ops", "the host time outside any op (Python)")
OPTIMIZER_BOUND = Rule("optimizer_bound", "ops", "the optimizer step's time")
MANY_SMALL_OPS = Rule("many_small_ops", "ops", "the time of the many small top-level ops")
STEP_BREAKDOWN = Rule("step_breakdown", "overview", "")
RULES = (PYTHON_OVERHEAD, OPTIMIZER_BOUND, MANY_SMALL_OPS, STEP_BREAKDOWN)

# CPU-only runs. python_overhead: the step runs no torch op for at least this share of it.
PYTHON_OVERHEAD_MIN_PCT = 20.0


# optimizer_bound: the optimizer takes at least this share of the step.
OPTIMIZER_MIN_PCT = 25.0


# many_small_ops: at least this many top-level ops per step shorter than SMALL_OP_NS, taking this share of it.
SMALL_OPS_MIN_PER_STEP = 500


SMALL_OP_NS = 20_000


SMALL_OPS_MIN_PCT = 20.0


def cpu_only(data: RankData, loader: iv.Intervals, comm: iv.Intervals | None) -> list[Finding]:
    """Runs without GPU activity: where the step goes (info), and the CPU-side problems that hold it."""
    steps = WindowSteps.of(data)
    n = len(steps)
    if data.hi <= data.lo:
        return []
    phases_iv = host.phase_unions(data.table, data.lo, data.hi)
    out = [_step_breakdown(data, steps, phases_iv, comm)]
    stretches = host_stretches(data)
    count, small, untraced = stretches.top_level, stretches.small, stretches.untraced
    price = price_of(data, untraced, min_pct=PYTHON_OVERHEAD_MIN_PCT)
    regions = host.regions_during(data.table, untraced)
    untraced_ns = iv.length(untraced)
    region = regions[0][0] if regions and regions[0][1] >= untraced_ns / 2 else None
    if region is not None:
        inside = f", most of it ({fmt_p(100 * regions[0][1] / untraced_ns)}) inside `{region}`"
    else:
        inside = ", most of it outside any annotated region"
    found = priced(
        PYTHON_OVERHEAD.id,
        data.rank,
        price,
        "step time in which no torch op runs",
        f"{fmt_ms(price.ms)} per step ({fmt_p(price.pct)} of the step) run no torch op at all (Python code, "
        f"sleeps, I/O, logging){inside}",
        "find that Python work with a sampling profiler (py-spy) and move it out of the step or vectorise it",
        {"region": region},
    )
    if found is not None:
        out.append(found)
    found = _optimizer_bound(data, phases_iv["optimizer"], stretches.no_op)
    if found is not None:
        out.append(found)
    if stretches.small_ops is not None:
        price = price_of(data, stretches.small_ops, min_pct=SMALL_OPS_MIN_PCT)
        found = priced(
            MANY_SMALL_OPS.id,
            data.rank,
            price,
            f"time of runs of top-level ops shorter than {SMALL_OP_NS / 1000:g} us (gaps under it included)",
            f"The step runs {small / n:.0f} top-level ops per step shorter than {SMALL_OP_NS / 1000:g} us, "
            f"one after another: {fmt_ms(price.ms)} per step with the Python between them, mostly overhead",
            "batch the work into fewer, larger tensor ops (vectorise loops, torch.compile, foreach ops)",
            {
                "top_level_ops_per_step": round(count / n, 1),
                "small_ops_per_step": round(small / n, 1),
            },
        )
        if found is not None:
            out.append(found)
    return out


def _optimizer_bound(data: RankData, optimizer: iv.Intervals, no_op: iv.Intervals) -> Finding | None:
    """optimizer_bound: the optimizer's time, with the advice its cause calls for: Python (no torch op runs for
    OUTSIDE_OPS_MIN_SHARE of it or more), one costly op, or many small ones (a fused optimizer)."""
    opt_ns = iv.length(optimizer)
    price = price_of(data, optimizer, min_pct=OPTIMIZER_MIN_PCT)
    if price.severity is None:
        return None
    n = price.steps
    ops = host.ops_during(data.table, optimizer)
    outside_pct = 100 * iv.length(iv.intersect(optimizer, no_op)) / opt_ns
    top = ops[0] if ops else None
    op_text = (
        f"`{code_name(top.name)}` ({fmt_p(100 * top.ns / opt_ns)} of its time, {top.calls / n:.0f} calls per step)"
        if top is not None
        else ""
    )
    if outside_pct >= 100 * OUTSIDE_OPS_MIN_SHARE:
        ran = f"its top op, {op_text}, is a small part of it" if top is not None else "no torch op runs in it"
        cause = f", {outside_pct:.0f}% of it runs no torch op: it is Python in the optimizer step ({ran})"
        action = python_action("the optimizer step")
    else:
        cause = f"; its top op is {op_text}" if top is not None else ""
        action = (
            f"make `{code_name(top.name)}` cheaper or run it less often"
            if top is not None and top.ns >= opt_ns / 2 and "foreach" not in top.name
            else PHASE_ACTIONS["optimizer"]
        )
    return priced(
        OPTIMIZER_BOUND.id,
        data.rank,
        price,
        "time in the optimizer",
        f"The optimizer takes {fmt_ms(price.ms)} per step ({fmt_p(price.pct)} of the step){cause}",
        action,
        {
            "top_op": top.name if top is not None else None,
            "top_op_calls_per_step": top.calls / n if top is not None else None,
            "outside_ops_pct": round(outside_pct, 2),
        },
    )


class HostStretches(msgspec.Struct, eq=False, frozen=True):
    """The host time python_overhead and many_small_ops price on a rank without GPU activity."""

    untraced: iv.Intervals  # no torch op runs (python_overhead), less the runs of small ops and the optimizer
    small_ops: iv.Intervals | None  # runs of small top-level ops (many_small_ops); None: too few per step
    top_level: int  # top-level ops in the window
    small: int  # of them, shorter than SMALL_OP_NS
    no_op: iv.Intervals  # all the time in which no torch op runs (host.untraced_time)


def host_stretches(data: RankData) -> HostStretches:
    """What python_overhead and many_small_ops price (also what a replay removes to price them). Each stretch
    is priced once: where optimizer_bound holds, the optimizer's time is its own (its Python and its small ops
    are not python_overhead's or many_small_ops')."""
    n = len(WindowSteps.of(data))
    count, small, small_ops = host.small_top_level_ops(data.table, data.lo, data.hi, SMALL_OP_NS)
    many_small = small / n >= SMALL_OPS_MIN_PER_STEP
    no_op = host.untraced_time(data.table, data.lo, data.hi)
    # the Python issuing a run of small ops one after another is that run's own cost (many_small_ops)
    untraced = iv.subtract(no_op, small_ops) if many_small else no_op
    optimizer = host.phase_unions(data.table, data.lo, data.hi)["optimizer"]
    if len(optimizer[0]) and price_of(data, optimizer, min_pct=OPTIMIZER_MIN_PCT).severity is not None:
        untraced = iv.subtract(untraced, optimizer)
        small_ops = iv.subtract(small_ops, optimizer)
    return HostStretches(untraced, small_ops if many_small else None, count, small, no_op)


def _step_breakdown(
    data: RankData, steps: WindowSteps, phases_iv: dict[str, iv.Intervals], comm: iv.Intervals | None
) -> Finding:
    """Where the median step goes, phase by phase, then the communication outside the phases and the rest: one
    step split (the median one by length, the lower of the two middle ones for an even count), so that its
    parts add up to it and their shares to 100%; a phase the trace never annotates is null, not 0."""
    annotated = host.annotated_phases(data.table)
    per_step = {p: steps.covered(u) for p, u in phases_iv.items()}
    if comm is not None:
        outside = iv.subtract(iv.clip(comm, data.lo, data.hi), all_of(phases_iv))
        per_step["communication"] = steps.covered(outside)
    per_step["other"] = np.maximum(steps.length - sum(per_step.values()), 0)
    k = int(np.argsort(steps.length, kind="stable")[(len(steps) - 1) // 2])
    step_ns = int(steps.length[k])
    number = int(data.steps.number[k]) if len(data.steps) == len(steps) else None
    split = {p: int(v[k]) for p, v in per_step.items()}
    shown = [(p, ns) for p, ns in split.items() if ns]
    shares = whole_percents([ns for _, ns in shown])
    parts = ", ".join(
        f"{host.PHASE_LABELS[p]} {fmt_ns(ns)} ({share}%)"
        for (p, ns), share in zip(shown, shares, strict=True)
    )
    evidence: Evidence = {
        f"{p}_ms_per_step": ms(ns) if p in ("other", "communication") or p in annotated else None
        for p, ns in split.items()
    }
    evidence.update({"step_ms": ms(step_ns), "step": number, "steps": len(steps)})
    which_step = f"step {number}, " if number is not None else ""
    split_of = f"the median of its {len(steps)} steps" if len(steps) > 1 else "its one step"
    unannotated = [host.PHASE_LABELS[p] for p in host.PHASES if p not in annotated]
    unknown = ""
    if unannotated:
        which = (
            " and ".join((", ".join(unannotated[:-1]), unannotated[-1]))
            if len(unannotated) > 1
            else unannotated[0]
        )
        unknown = f" The trace does not annotate {which}: that time is in other code."
    return Finding(
        STEP_BREAKDOWN.id,
        "info",
        data.rank,
        f"No GPU activity: {split_of} ({which_step}{fmt_ns(step_ns)}) goes to {parts}.{unknown}",
        evidence,
        steps=len(steps),
    )


def whole_percents(values: list[int]) -> list[int]:
    """`values` as whole percentages of their sum that add up to 100 (largest remainders rounded up)."""
    total = sum(values)
    if total <= 0:
        return [0] * len(values)
    exact = [100 * v / total for v in values]
    out = [int(x) for x in exact]
    for i in sorted(range(len(values)), key=lambda i: (out[i] - exact[i], i))[: 100 - sum(out)]:
        out[i] += 1
    return out
