"""Findings priced by replay (#29): each finding's saving is the step time that removing its work saves in a
replay of the rank's steps (analysis/whatif), so that savings that overlap are not counted twice and work hidden
behind other work saves nothing; findings are ranked by that saving.

Per rank, the dependency graph is built once and replayed with nothing changed, once per finding with the work
it names removed (`FIXES`: the `stepscope whatif` selectors of each kind of finding, or the host stretches its
rule prices), and once with the work of all of them removed (`ReplaySavings`: the sum of the savings against the
saving of all of them together). A step of a replay ends when both its host work and the GPU work launched in it
are done; a finding's saving is the median over the window's steps of the step's replayed time less its time
with the work removed, as rule prices are medians. A finding's severity follows that saving: one whose replay
saves less than its rule's price keeps the severity of the saving (LOW at least) and says so, with why.
Findings no replay can express (the fix changes the kernels
themselves, or the finding is about several ranks, which are replayed one by one) keep their rule's price and
say why (docs/analysis.md, "Findings priced by replay").
"""

from __future__ import annotations

import re
from collections.abc import Callable

import msgspec
import numpy as np

from stepscope.analysis import intervals as iv
from stepscope.analysis.findings.cpu_only import host_stretches
from stepscope.analysis.findings.pricing import SEVERITY_PCT, Finding, severity_of
from stepscope.analysis.per_rank.prepare import RankData
from stepscope.analysis.per_rank.steps import region_union
from stepscope.analysis.whatif.fidelity import approximate_text, fidelity, limits
from stepscope.analysis.whatif.graph import RankGraph, build_graph
from stepscope.analysis.whatif.replay import Replay, Scaling, replay
from stepscope.analysis.whatif.select import parse_selector, scaling_for

__all__ = [
    "REPLAY_MAX_FINDINGS",
    "OpChange",
    "ReplaySavings",
    "by_saving",
    "op_savings",
    "price_by_replay",
    "priced_by_rule",
]

# the costliest findings of a rank (by their rule's price) that are replayed, each replay costing about as much
# as the graph (a few ms per 10,000 GPU activities); the others keep their rule's price
REPLAY_MAX_FINDINGS = 4


class ReplaySavings(msgspec.Struct):
    """What the replay-priced findings of one rank save: each alone, added up, and all of them removed in one
    replay (less than the sum where they name the same time)."""

    replayed_step_ms: float  # the median step of the replay with nothing changed
    findings: list[str]  # the ids of the findings priced by replay, by saving
    whatif: list[
        str
    ]  # the selectors of all of them (the host stretches of python_overhead and many_small_ops
    # are removed too, though no selector names them)
    sum_ms_per_step: float  # their savings added up
    combined_ms_per_step: float  # the saving of one replay with the work of all of them removed


class _Fix(msgspec.Struct):
    """The work a finding names: `stepscope whatif` selectors, and host stretches no selector names."""

    selectors: list[str] = msgspec.field(default_factory=list)
    host: list[iv.Intervals] = msgspec.field(default_factory=list)
    what: str = ""


def _selector(text: str) -> Callable[[RankData, Finding], _Fix | None]:
    return lambda data, f: _Fix([text.format(rank=data.rank)])


def _host_bound(data: RankData, f: Finding) -> _Fix | None:
    """host_bound names the op that holds the host in the phase where the GPU waits most, when one does."""
    op = f.evidence.get(f"{f.evidence.get('phase')}_top_op")
    if not isinstance(op, str):
        return None
    return _Fix([f"op:^{re.escape(op)}$@{data.rank}=0"])


def _gpu_only(text: str) -> Callable[[RankData, Finding], _Fix | None]:
    return lambda data, f: _Fix([text.format(rank=data.rank)]) if len(data.gpu) else None


def _python_overhead(data: RankData, f: Finding) -> _Fix | None:
    return _Fix(host=[host_stretches(data).untraced], what="the host time in which no torch op runs")


def _many_small_ops(data: RankData, f: Finding) -> _Fix | None:
    small = host_stretches(data).small_ops
    return None if small is None else _Fix(host=[small], what="the runs of small top-level ops")


# What removing each kind of finding's work is, in a replay of its rank. Each removes the work the rule prices
# (factor 0), as the rule's price does: a saving is, like a price, an upper bound on what the fix buys.
FIXES: dict[str, Callable[[RankData, Finding], _Fix | None]] = {
    "data_loader_stall": _selector("data_loader@{rank}=0"),
    "sync_points": _selector("sync@{rank}=0"),
    "optimizer_bound": _selector("optimizer@{rank}=0"),
    "comm_bound": _gpu_only("communication@{rank}=0"),
    "poor_overlap": _gpu_only("communication@{rank}=0"),
    "pageable_copies": _selector("kernel:HtoD.*Pageable|Pageable.*HtoD@{rank}=0"),
    "fsdp_exposed_all_gather": _gpu_only("kernel:(?i)all_?gather@{rank}=0"),
    "host_bound": _host_bound,
    "python_overhead": _python_overhead,
    "many_small_ops": _many_small_ops,
}

# Why a finding keeps its rule's price.
RULE_ONLY = {
    "launch_bound": "its fix (fusing kernels, CUDA graphs) changes the kernels and their launches, which no "
    "scaling of the trace's work expresses",
    "tiny_kernels": "its fix (fusing kernels) changes the kernels, which no scaling of the trace's work expresses",
    "host_bound": "no single op holds the host while the GPU waits, and removing a whole phase would remove its "
    "kernels too",
    "comm_bound": "a CPU backend's collectives are judged across ranks, and each rank is replayed alone",
    "poor_overlap": "a CPU backend's collectives are judged across ranks, and each rank is replayed alone",
    "fsdp_exposed_all_gather": "a CPU backend's all-gathers are host ranges shared with the other collectives",
    "collective_slow": "it is about several ranks' collectives, and each rank is replayed alone",
    "straggler": "it is about the other ranks' waiting, and each rank is replayed alone",
    "ep_comm_exposed": "it is judged across ranks, and each rank is replayed alone",
    "pipeline_bubble": "it is about the pipeline's stages together, and each rank is replayed alone",
    "python_hotspot": "py-spy's samples price it; the trace does not hold the function's time",
}


def on_rank(selectors: list[str], rank: int) -> list[str]:
    """`selectors` of one rank's findings (`...@R=F`) given to rank `rank` (a file analysed on its own, then given
    its rank in the job)."""
    return [re.sub(r"@\d+=([^=]*)$", lambda m: f"@{rank}={m.group(1)}", s) for s in selectors]


def price_by_replay(
    data: RankData, findings: list[Finding], graph: RankGraph | None = None
) -> tuple[list[Finding], ReplaySavings | None]:
    """`findings` of one rank, those a replay can express priced by it (the others as they are: `priced_by_rule`
    fills their fields), and what they save together. `graph`: the rank's graph, where already built (else
    built here from `data`)."""
    order = sorted(
        (i for i, f in enumerate(findings) if f.cost_ms_per_step is not None and f.id in FIXES),
        key=lambda i: -(findings[i].cost_ms_per_step or 0.0),
    )
    fixes = {i: fix for i in order[:REPLAY_MAX_FINDINGS] if (fix := FIXES[findings[i].id](data, findings[i]))}
    if not fixes or data.hi <= data.lo:
        return findings, None
    graph = graph if graph is not None else build_graph(data)
    graph.measured = replay(graph)
    base = _step_ns(graph, graph.measured)
    check = fidelity(data.rank, _step_ns(graph, None), base, limits(graph))
    if check.approximate:
        # (a replay that does not give back the measured steps cannot price a change to them)
        why = f"{approximate_text(check)}, so it prices no change"
        return [_by_rule(f, why) if i in fixes else f for i, f in enumerate(findings)], None
    out = list(findings)
    savings: dict[int, float] = {}
    for i, fix in fixes.items():
        saved = _saving(base, _step_ns(graph, replay(graph, _scaling(graph, [fix]))))
        savings[i] = saved
        what = " and ".join([*fix.selectors, *([fix.what] if fix.what else [])])
        out[i] = by_saving(
            msgspec.structs.replace(
                findings[i],
                saving_ms_per_step=round(saved / 1e6, 3),
                saving_from="replay",
                whatif=fix.selectors,
                saving_note=f"replayed median step {_ms(np.median(base))} ms; with {what} removed, it saves "
                f"{_ms(saved)} ms (the median of the {len(base)} steps' savings)",
            ),
            float(np.median(base)),
        )
    for i in order[REPLAY_MAX_FINDINGS:]:
        out[i] = _by_rule(
            findings[i], f"only the {REPLAY_MAX_FINDINGS} costliest findings of a rank are replayed"
        )
    combined = (
        _saving(base, _step_ns(graph, replay(graph, _scaling(graph, list(fixes.values())))))
        if len(fixes) > 1
        else next(iter(savings.values()))
    )
    ranked = sorted(fixes, key=lambda i: (-savings[i], findings[i].id))
    return out, ReplaySavings(
        replayed_step_ms=_ms(np.median(base)),
        findings=[findings[i].id for i in ranked],
        whatif=[s for i in ranked for s in fixes[i].selectors],
        sum_ms_per_step=_ms(sum(savings.values())),
        combined_ms_per_step=_ms(combined),
    )


class OpChange(msgspec.Struct, frozen=True):
    """The calls of one op made faster: their work at `factor` of its time."""

    op: str  # the op's name (aten::mm): every call of it
    factor: float


class OpSavings(msgspec.Struct):
    """What each change saves of one rank's median step in a replay, and the replay's own error."""

    saving_ms: list[float]  # per change, in the order given
    replayed_step_ms: float
    error_pct: float | None  # the replay with nothing changed against the measured steps
    approximate: str | None  # why the replay cannot price a change (it does not give back the steps), or None


def op_savings(data: RankData, changes: list[OpChange], graph: RankGraph | None = None) -> OpSavings | None:
    """Each change replayed on the rank's steps (`stepscope ops`' findings, priced in step time): on a GPU trace
    the device work launched inside the op's calls is scaled (a faster kernel; the host's launches stay), on a
    CPU trace the calls' own time. None where the rank has no steps to replay."""
    if data.hi <= data.lo:
        return None
    graph = graph if graph is not None else build_graph(data)
    base = _step_ns(graph, replay(graph))
    check = fidelity(data.rank, _step_ns(graph, None), base, limits(graph))
    if check.approximate:
        return OpSavings([], _ms(np.median(base)), check.error_pct, approximate_text(check))
    out = []
    for change in changes:
        scaling = Scaling(matched={})
        host = region_union(data.table, re.compile(f"^{re.escape(change.op)}$"))
        if host is not None and len(host[0]):
            gpu = graph.gpu
            if len(gpu):
                at = np.searchsorted(host[0], gpu.launch, side="right") - 1
                inside = (at >= 0) & (gpu.launch < host[1][np.maximum(at, 0)])
                scaling.gpu = np.where(inside, change.factor, 1.0)
            else:
                scaling.host.append((host[0], host[1], change.factor))
        out.append(_ms(_saving(base, _step_ns(graph, replay(graph, scaling)))))
    return OpSavings(out, _ms(np.median(base)), check.error_pct, None)


_RANK = {name: len(SEVERITY_PCT) - k for k, (name, _) in enumerate(SEVERITY_PCT)}


def by_saving(f: Finding, step_ns: float) -> Finding:
    """`f` with the severity of what its replay saves, where that is lower than its rule's (LOW at least), and
    its message saying why."""
    saved = f.saving_ms_per_step or 0.0
    severity = severity_of(100.0 * saved * 1e6 / step_ns if step_ns > 0 else 0.0) or "low"
    if _RANK.get(severity, 0) >= _RANK.get(f.severity, 0):
        return f
    why = (
        f" {f.severity.upper()} by its price, {severity.upper()} by what fixing it saves: a replay of the rank's "
        f"steps without it ends them only {_ms(saved * 1e6)} ms sooner per step, as other work of the rank (its "
        "host, other streams, waiting) then takes the time it frees."
    )
    return msgspec.structs.replace(f, severity=severity, message=f.message + why)


def priced_by_rule(findings: list[Finding]) -> list[Finding]:
    """`findings` with the saving of those no replay priced taken from their rule's price."""
    return [
        _by_rule(f, RULE_ONLY.get(f.id, "no what-if expresses its work"))
        if f.saving_from is None and f.cost_ms_per_step is not None
        else f
        for f in findings
    ]


def _by_rule(f: Finding, why: str) -> Finding:
    return msgspec.structs.replace(
        f,
        saving_ms_per_step=f.cost_ms_per_step,
        saving_from="rule",
        whatif=[],
        saving_note=f"not replayed: {why}",
    )


def _scaling(graph: RankGraph, fixes: list[_Fix]) -> Scaling:
    scaling = scaling_for(graph, [parse_selector(s) for fix in fixes for s in fix.selectors])
    for fix in fixes:
        scaling.host.extend((start, end, 0.0) for start, end in fix.host if len(start))
    return scaling


def _step_ns(graph: RankGraph, rep: Replay | None) -> np.ndarray:
    """Each step of a replay, ending when both its host work and the GPU work launched in it are done (without
    the GPU's part, a replay whose host no longer waits for the GPU would end its steps before their work);
    `rep` None: the measured steps, the same way (what the replay with nothing changed is checked against)."""
    gpu = graph.gpu
    end = (rep.step_end if rep is not None else graph.step_end).astype(np.int64)
    step_start = rep.step_start if rep is not None else graph.step_start
    if len(gpu):
        gpu_end = rep.gpu_end if rep is not None else gpu.start + gpu.dur
        done = np.maximum.accumulate(gpu_end)  # the latest end among the first k activities launched
        launched = np.searchsorted(gpu.launch, graph.step_end, side="right")
        end = np.maximum(end, np.where(launched > 0, done[np.maximum(launched, 1) - 1], end))
    end = np.maximum.accumulate(end)
    start = np.maximum(step_start, np.r_[step_start[:1], end[:-1]])
    return np.asarray(end - start, dtype=np.int64)


def _saving(base: np.ndarray, scaled: np.ndarray) -> float:
    """The median over the steps of each step's saving (never below 0: removing work never costs time)."""
    return max(float(np.median(base - scaled)), 0.0)


def _ms(ns: float) -> float:
    return round(float(ns) / 1e6, 3)
