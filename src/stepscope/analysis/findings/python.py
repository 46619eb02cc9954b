"""Findings from what capture sampled outside the trace: py-spy's Python stacks and tracemalloc's heap.

`python_findings` names, in the evidence of every host-side finding (the time the host spends on Python, the
data loader, small ops, a straggler's cause), the Python functions holding the rank's time, and raises
`python_hotspot` for the function that holds most of the step on its own (priced by its self share of the
median step). `host_memory_findings` raises `host_memory_growth` for each allocation site that grows in every
window (info: memory, not step time).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from stepscope.analysis.findings.pricing import Finding, severity_of
from stepscope.analysis.findings.rule import Rule
from stepscope.analysis.run.hostmem import HostMemoryFacts
from stepscope.analysis.run.python_samples import PythonProfile
from stepscope.units import fmt_bytes, fmt_ms, fmt_pct

PYTHON_HOTSPOT = Rule(
    "python_hotspot", "host", "the step time with one Python function at the top of the stack (py-spy)"
)
HOST_MEMORY_GROWTH = Rule("host_memory_growth", "host", "")
RULES = (PYTHON_HOTSPOT, HOST_MEMORY_GROWTH)

# python_hotspot: the function's self share of the training thread's time reaches this.
PYTHON_HOTSPOT_MIN_PCT = 10.0
# the findings whose evidence names the Python functions of their rank
HOST_SIDE_IDS = frozenset(
    {
        "python_overhead",
        "host_bound",
        "launch_bound",
        "many_small_ops",
        "optimizer_bound",
        "data_loader_stall",
        "straggler",
    }
)
EVIDENCE_FUNCTIONS = 3  # functions listed in a host-side finding's evidence


def profile_for(profiles: Sequence[PythonProfile], rank: int, steps: Sequence[int]) -> PythonProfile | None:
    """The profile of `rank`'s window that holds the analysed `steps`, else its latest."""
    own = [p for p in profiles if p.rank == rank and p.samples]
    if not own:
        return None
    for p in own:
        if steps and all(p.first_step <= s <= p.last_step for s in steps):
            return p
    return max(own, key=lambda p: p.last_step)


def _function_text(p: PythonProfile, n: int) -> str:
    return "; ".join(
        f"{f.function} ({f.where}): self {f.self_pct:.1f}%, inclusive {f.inclusive_pct:.1f}%"
        for f in p.functions[:n]
    )


def python_findings(
    findings: list[Finding],
    profiles: Sequence[PythonProfile],
    steps: Mapping[int, Sequence[int]],
    step_ms: Mapping[int, float],
) -> list[Finding]:
    """`findings` with the Python functions of their rank in the host-side ones' evidence and message, and a
    python_hotspot finding per rank whose top function holds PYTHON_HOTSPOT_MIN_PCT of the step or more.
    `steps`: the analysed step numbers of each rank; `step_ms`: its median step (ms)."""
    out: list[Finding] = []
    for f in findings:
        p = profile_for(profiles, f.rank, steps.get(f.rank, ())) if f.rank is not None else None
        if f.id not in HOST_SIDE_IDS or p is None or not p.functions:
            out.append(f)
            continue
        top = p.functions[0]
        evidence = {
            **f.evidence,
            "python_function": top.function,
            "python_where": top.where,
            "python_self_pct": top.self_pct,
            "python_inclusive_pct": top.inclusive_pct,
            "python_functions": _function_text(p, EVIDENCE_FUNCTIONS),
        }
        said = (
            f" py-spy: the rank's Python time is mostly in `{top.function}` ({top.where}): "
            f"{fmt_pct(top.self_pct)} of its time on its own, {fmt_pct(top.inclusive_pct)} with what it calls."
        )
        out.append(msgspec.structs.replace(f, evidence=evidence, message=f.message + said))
    for rank in sorted({p.rank for p in profiles}):
        p = profile_for(profiles, rank, steps.get(rank, ()))
        found = _hotspot(p, step_ms.get(rank)) if p is not None else None
        if found is not None:
            out.append(found)
    return out


def _hotspot(p: PythonProfile, step_ms: float | None) -> Finding | None:
    if not p.functions:
        return None
    top = p.functions[0]
    if top.self_pct < PYTHON_HOTSPOT_MIN_PCT:
        return None
    if step_ms is None:
        sampled_steps = max(p.last_step - p.first_step + 1, 1)
        step_ms = 1000 * p.sampled_s / sampled_steps
    cost = step_ms * top.self_pct / 100
    severity = severity_of(top.self_pct) or "low"
    action = (
        f"make `{top.function}` cheaper: turn its loops into tensor ops, cache what it recomputes each step, or "
        "move it out of the step (a DataLoader worker, every N steps)"
    )
    message = (
        f"The Python function `{top.function}` ({top.where}) is at the top of the training thread's Python stack "
        f"for {fmt_pct(top.self_pct)} of the step ({fmt_ms(cost)} of {fmt_ms(step_ms)}; "
        f"{fmt_pct(top.inclusive_pct)} with the functions it calls), the native code it calls included; {action}."
    )
    return Finding(
        PYTHON_HOTSPOT.id,
        severity,
        p.rank,
        message,
        {
            "function": top.function,
            "where": top.where,
            "file": top.file,
            "line": top.line,
            "self_pct": top.self_pct,
            "inclusive_pct": top.inclusive_pct,
            "self_samples": top.self_samples,
            "samples": p.samples,
            "time_samples": p.time_samples,
            "sampled_steps": f"{p.first_step}-{p.last_step}",
            "step_ms": round(step_ms, 3),
            "python_functions": _function_text(p, EVIDENCE_FUNCTIONS),
            "arithmetic": f"{top.self_samples} of the thread's {p.time_samples} samples ({p.sampled_s:.3f} s at "
            f"{p.rate_hz} Hz) have it at the top: {top.self_pct:.2f}% x the median step {step_ms:.3f} ms "
            f"= {cost:.3f} ms",
        },
        cost_ms_per_step=round(cost, 3),
        pct_of_step=round(top.self_pct, 2),
        action=action,
    )


def host_memory_findings(facts: Sequence[HostMemoryFacts]) -> list[Finding]:
    """One host_memory_growth finding per rank whose Python heap grows at a site in every window."""
    out = []
    for h in facts:
        if not h.growing:
            continue
        site = h.growing[0]
        windows = "in each of its windows" if h.windows > 1 else "in its one window"
        others = f" ({len(h.growing) - 1} more sites grow too)" if len(h.growing) > 1 else ""
        action = (
            f"free what `{site.function}` keeps from step to step (a list appended to each step, a cache without "
            "a bound, tensors kept for logging: keep .item() or .detach().cpu() copies, or clear them)"
        )
        out.append(
            Finding(
                HOST_MEMORY_GROWTH.id,
                "info",
                h.rank,
                f"Python allocations at `{site.function}` ({site.where}) grow {fmt_bytes(site.growth_bytes_per_step)}"
                f" per step {windows} ({fmt_bytes(site.size_bytes)} alive at the last window's end){others}; "
                f"{action}.",
                {
                    "function": site.function,
                    "where": site.where,
                    "file": site.file,
                    "line": site.line,
                    "growth_bytes_per_step": site.growth_bytes_per_step,
                    "size_bytes": site.size_bytes,
                    "windows": h.windows,
                    "growing_sites": len(h.growing),
                },
                action=action,
            )
        )
    return out
