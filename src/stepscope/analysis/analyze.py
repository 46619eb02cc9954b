"""`analyze`: every per-rank analysis, the cross-rank view and the findings, as one plain result (no printing).

Schema "stepscope.analysis/4" is what `stepscope analyze --json` prints; its fields are documented in
docs/analysis.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from stepscope.analysis import intervals as iv
from stepscope.analysis.cross_rank.dimensions import Dimensions, dimensions
from stepscope.analysis.cross_rank.distributed import CrossRank, cross_rank_analysis, summarize_rank
from stepscope.analysis.cross_rank.pipeline import Pipeline, pipeline_analysis, pipeline_notices
from stepscope.analysis.cross_rank.straggler import GroupStraggler, GroupWaiting, Straggler
from stepscope.analysis.findings.comm import comm_findings
from stepscope.analysis.findings.comm_rank import exposed_comm
from stepscope.analysis.findings.comm_wait import transfer_only
from stepscope.analysis.findings.expert import ep_findings
from stepscope.analysis.findings.fsdp import fsdp_findings
from stepscope.analysis.findings.groups import group_across_ranks
from stepscope.analysis.findings.pipeline import pipeline_findings
from stepscope.analysis.findings.replayed import ReplaySavings, price_by_replay
from stepscope.analysis.findings.rules import Finding, rank_by_cost, rank_findings, straggler_findings
from stepscope.analysis.options import AnalysisOptions, with_changes
from stepscope.analysis.per_rank.breakdown import (
    KernelTypes,
    Temporal,
    TopKernel,
    kernel_type_breakdown,
    temporal_breakdown,
    top_kernels,
)
from stepscope.analysis.per_rank.comm.collectives import Instances, rank_instances, wait_intervals
from stepscope.analysis.per_rank.comm.groups import KnownGroups
from stepscope.analysis.per_rank.comm.stats import CollectiveStats, collective_stats
from stepscope.analysis.per_rank.idle import StreamIdle, idle_by_stream
from stepscope.analysis.per_rank.kernels import COMMUNICATION, compile_patterns
from stepscope.analysis.per_rank.overlap import CommOverlap, comm_compute_overlap
from stepscope.analysis.per_rank.overview import StepCategories, add_comm_waiting, step_categories
from stepscope.analysis.per_rank.parallelism.expert import Expert, ExpertPart, expert_rank, imbalance
from stepscope.analysis.per_rank.parallelism.fsdp import FsdpAnalysis, FsdpRank, combine_fsdp, fsdp_rank
from stepscope.analysis.per_rank.parallelism.pipeline import RankPipeline, rank_pipeline
from stepscope.analysis.per_rank.parallelism.tensor import Tensor, TensorRank, tensor_rank
from stepscope.analysis.per_rank.prepare import RankData, RankDigest, effective_launch, prepare_rank
from stepscope.analysis.per_rank.steps import StepRow, ns_to_us, step_table
from stepscope.analysis.per_rank.summary import keep_op_trees
from stepscope.analysis.read.table import TraceTable
from stepscope.analysis.whatif.couple import couple, replay_job
from stepscope.analysis.whatif.cpu_comm import rank_graph
from stepscope.analysis.whatif.fidelity import fidelity, limits
from stepscope.analysis.whatif.graph import RankGraph
from stepscope.analysis.whatif.path import CriticalPath, job_critical_path, summarize_path
from stepscope.analysis.whatif.timeline import median_step, path_timeline

if TYPE_CHECKING:  # (only run folders have RunFacts: a trace file needs none of the run folder's modules)
    from stepscope.analysis.run.folder import RunFacts

SCHEMA = "stepscope.analysis/4"


class WindowInfo(msgspec.Struct):
    """The part of the trace analysed: from the first kept ProfilerStep to the end of the last one."""

    start_us: float  # trace clock
    dur_us: float
    steps: int  # steps inside the window
    total_steps: int  # ProfilerStep spans in the trace
    dropped_last_step: bool


class RankAnalysis(msgspec.Struct):
    """Everything `analyze` says about one rank. GPU sections are null/empty without GPU activity."""

    rank: int
    source: str
    window: WindowInfo
    temporal: Temporal | None
    kernel_types: KernelTypes | None
    idle_by_stream: list[StreamIdle]
    overlap_pct: float | None  # communication overlapped by computation; null without communication
    communication: CommOverlap | None
    top_kernels: list[TopKernel]
    steps: list[StepRow]
    notes: list[str]
    collectives: list[CollectiveStats] = []  # per kind and process group, over the window
    clock_offset_us: float | None = None  # against the reference rank (null: a single rank)
    # each step's wall time in TensorBoard's overview categories (kernel, memcpy, ..., other)
    step_categories: list[StepCategories] = []
    # what the findings priced by replay save, each alone and together; null: none is (findings/replayed.py)
    replay_savings: ReplaySavings | None = None


class AnalysisResult(msgspec.Struct):
    """The document printed by `stepscope analyze --json`."""

    schema: str
    ranks: list[RankAnalysis]
    cross_rank: CrossRank | None  # two ranks or more: step and collective time per rank, clock alignment
    straggler: Straggler | None  # the rank the others wait for, with its cause; null when none stands out
    # by what fixing them saves (saving_ms_per_step), largest first; info last; one per problem, naming its ranks
    findings: list[Finding]
    notices: list[str]
    run: RunFacts | None = None  # run folders: what the run measured outside its traces
    # communication per step by parallel dimension, per rank and for the job; null without collectives
    dimensions: Dimensions | None = None
    expert: Expert | None = None  # expert-parallel all-to-alls and DeepEP kernels; null when none
    tensor: Tensor | None = (
        None  # tensor-parallel functional collectives by layer, fused async-TP ops; null: none
    )
    fsdp: FsdpAnalysis | None = None  # FSDP's units, all-gathers and reduce-scatters per rank; null: no FSDP
    pipeline: Pipeline | None = None  # pipeline stages, micro-batches, bubbles; null: none recognised
    # what bounds the job's step, across ranks (whatif/path.py); null: no step to replay
    critical_path: CriticalPath | None = None
    stragglers: list[
        GroupStraggler
    ] = []  # per process group, each rank its other members wait for consistently
    # per process group, its waiting for peers split among the ranks waited for, and whether any is a straggler
    waiting_by_group: list[GroupWaiting] = []


# Records of arrays: compared and printed by identity (a field-wise == of arrays raises, and their repr
# would print the arrays); generating __eq__ and __repr__ cost ~0.15 ms of every start.
class RankPart(msgspec.Struct, eq=False):
    """One rank's share of `analyze`: its sections, its own findings, its collectives and what the cross-rank
    analysis needs. Small (no rows of the trace): this is what a worker process sends back."""

    analysis: RankAnalysis
    findings: list[Finding]
    instances: Instances
    summary: RankDigest
    expert: ExpertPart | None = None
    tensor: TensorRank | None = None
    fsdp: FsdpRank | None = None
    pipeline: RankPipeline | None = None
    graph: RankGraph | None = None  # the what-if graph of its window, without its trace (whatif/graph.py)


def analyze(
    table: TraceTable,
    options: AnalysisOptions | None = None,
    *,
    known_groups: KnownGroups | None = None,
    critical_path: bool = True,
    **changes: Any,
) -> AnalysisResult:
    """Analyse every rank of `table` over its profiler-step window (`options`, or the defaults with `changes`:
    AnalysisOptions' fields; those of the window's rows and the kernels listed are read here).

    `comm_patterns`: regexes; GPU kernels whose names match one are communication (docs/analysis.md).
    `steps`: (first, last) step numbers, inclusive (None: open): only those ProfilerSteps form the window;
    InputError when a rank has none of them. `known_groups`: the job's process groups by name, where a record of
    them is at hand (analyze_rank_part). `critical_path=False`: without the job's critical path (combine_ranks)."""
    options = with_changes(options, changes)
    ranks = table.rank_ids()
    parts = [
        analyze_rank_part(table, rank, options, known_groups=known_groups, cross_rank=len(ranks) > 1)
        for rank in ranks
    ]
    return combine_ranks(parts, table.notices, critical_path=critical_path)


def analyze_rank_part(
    table: TraceTable,
    rank: int,
    options: AnalysisOptions | None = None,
    *,
    cross_rank: bool = True,
    known_groups: KnownGroups | None = None,
    **changes: Any,
) -> RankPart:
    """Everything `analyze` finds out about one rank on its own (the unit of work of `analyze_path`'s tasks;
    `options` or the defaults with `changes`, as for `analyze`).

    `cross_rank=False`: no other rank will be compared with this one, so its summary leaves out the CPU ops'
    self time per step (only a straggler's cause reads it; on a big trace it is a third of the analysis).
    `known_groups`: the job's process groups by name ({description, ranks, backend, mesh_dim}), where a record
    of them is at hand (per_rank/comm/groups.py)."""
    options = with_changes(options, changes)
    data = prepare_rank(
        table,
        rank,
        drop_last_step=options.drop_last_step,
        comm_patterns=compile_patterns(options.comm_patterns),
        steps=options.steps,
    )
    # The cross-rank summary first: the nesting of every host op it computes for the ops' self times is needed
    # after it only for the cpu_ops (derived from it now); the table's other derived values are dropped (on a big
    # trace they are a hundred MB or more, which would add to the peaks of what follows)
    summary = summarize_rank(data, ops=cross_rank)
    keep_op_trees(data.table, ("cpu_op",))
    result = analyze_rank(data, top=options.top, comm=summary.comm)
    world = table.ranks[rank].world_size if rank in table.ranks else None
    instances = rank_instances(data, world, known_groups)
    findings = rank_findings(data, result.temporal, result.communication, summary.comm)
    if result.communication is not None:  # (what comm_bound prices, for its transfer across ranks)
        summary.comm_unhidden = exposed_comm(data)[1]
    fsdp = fsdp_rank(data, instances)
    if fsdp is not None:
        findings.extend(fsdp_findings(data, fsdp))
    graph = rank_graph(data, instances)
    findings, result.replay_savings = price_by_replay(data, findings, graph)
    graph.data = None  # (the part travels between processes: not the trace)
    if cross_rank:  # (nor the replay: only a single rank's critical path, in this process, reuses it)
        graph.measured = None
    pipeline = rank_pipeline(data, instances, known_groups)
    return RankPart(
        result, findings, instances, summary, expert_rank(data), tensor_rank(data), fsdp, pipeline, graph
    )


def combine_ranks(
    parts: Sequence[RankPart], notices: Sequence[str] = (), *, critical_path: bool = True
) -> AnalysisResult:
    """The cross-rank view and the ranked findings from every rank's part (parts in rank order);
    `critical_path=False` leaves the job's critical path out (the ranks replayed together: a diff shows none)."""
    ranks = [p.analysis for p in parts]
    findings = [f for p in parts for f in p.findings]
    instances = {p.analysis.rank: p.instances for p in parts}
    summaries = {p.analysis.rank: p.summary for p in parts}
    dist = cross_rank_analysis(summaries, instances, {r.rank: r.steps for r in ranks})
    matched = dist.alignment is not None and dist.alignment.matched > 0
    for result in ranks:
        result.collectives = collective_stats(
            instances[result.rank], dist.wait_ns[result.rank] if matched else None
        )
        if dist.alignment is not None:
            result.clock_offset_us = round(dist.offsets_ns[result.rank] / 1e3, 3)
        summary = summaries[result.rank]
        if matched and summary.comm_exposed is not None and (dist.wait_ns[result.rank] >= 0).any():
            waiting = wait_intervals(instances[result.rank], dist.wait_ns[result.rank])
            add_comm_waiting(result.step_categories, summary.steps, summary.comm_exposed, waiting)
    findings = transfer_only(findings, instances, dist, summaries)
    findings.extend(comm_findings(instances, dist, summaries))
    expert_parts = {p.analysis.rank: p.expert for p in parts if p.expert is not None}
    expert = None
    if expert_parts:
        expert = Expert(
            [e.stats for e in expert_parts.values()], imbalance([e.stats for e in expert_parts.values()])
        )
        findings.extend(ep_findings(expert_parts, summaries, expert.imbalance))
    tensor_ranks = [p.tensor for p in parts if p.tensor is not None]
    findings.extend(straggler_findings(dist.stragglers))
    pipe_parts = {p.analysis.rank: p.pipeline for p in parts}
    pipeline = pipeline_analysis(pipe_parts)
    # (one finding for the whole pipeline, naming its stages' ranks: not grouped)
    findings = rank_by_cost([*group_across_ranks(findings), *pipeline_findings(pipeline, summaries)])
    return AnalysisResult(
        SCHEMA, ranks, dist.cross, dist.straggler, findings,
        [*notices, *dist.notices, *pipeline_notices(pipe_parts)],
        critical_path=_critical_path(parts) if critical_path else None,
        dimensions=dimensions(instances, summaries),
        expert=expert, tensor=Tensor(tensor_ranks) if tensor_ranks else None,
        fsdp=combine_fsdp([p.fsdp for p in parts]), pipeline=pipeline, stragglers=dist.stragglers,
        waiting_by_group=dist.waiting,
    )  # fmt: skip


def _critical_path(parts: Sequence[RankPart]) -> CriticalPath | None:
    """The job's critical path over its steps: the ranks' graphs replayed together (whatif/)."""
    graphs = {p.analysis.rank: p.graph for p in parts if p.graph is not None and len(p.graph.step_start)}
    if not graphs:
        return None
    coupling = couple(graphs, {r: p.instances for p in parts if (r := p.analysis.rank) in graphs})
    kept = [g.measured for g in graphs.values()]
    if len(graphs) == 1 and not len(coupling) and kept[0] is not None:
        replays = dict(zip(graphs, kept, strict=True))  # (what replay_job gives one rank: its replay)
    else:
        replays, _ = replay_job(graphs, coupling)
    measured = max(float(np.mean(g.step_end - g.step_start)) for g in graphs.values())
    replayed = max(float(np.mean(r.step_ns)) for r in replays.values())
    error = round(100 * (replayed - measured) / measured, 3) if measured else None
    steps = job_critical_path(replays, coupling)
    path = summarize_path(steps, error)
    if path is not None:
        path.replay = [
            fidelity(r, g.step_end - g.step_start, replays[r].step_ns, limits(g)) for r, g in graphs.items()
        ]
        path.approximate = any(f.approximate for f in path.replay)
        k = median_step(steps)
        marked = any(p.analysis.steps for p in parts)
        path.timeline = path_timeline(replays, coupling, k, steps[k].step_ms, marked=marked)
    return path


def attach_run(result: AnalysisResult, facts: RunFacts) -> AnalysisResult:
    """`result` with what its run folder measured outside the traces (`facts`): `run`, a notice where the
    profiled steps are much slower than the plain ones (run/overhead.py), and the findings that come from it
    (the Python functions py-spy sampled in the host-side findings, python_hotspot, host_memory_growth), ranked
    again with the others; the watch's windows (`facts.anomalies`) first."""
    from stepscope.analysis.findings.python import host_memory_findings, python_findings
    from stepscope.analysis.run.overhead import profiler_overhead_notice
    from stepscope.analysis.stats import median

    result.run = facts
    profiled = {r.rank: [s.dur_us / 1000 for s in r.steps] for r in result.ranks}
    overhead = profiler_overhead_notice(profiled, facts.step_times)
    watched = [
        a for a in facts.anomalies if {a.last, *a.also} & {r.steps[-1].step for r in result.ranks if r.steps}
    ]
    if overhead is not None and watched:
        # (the analysed window is one the watch opened: its steps are slow for what it caught, not the profiler)
        w = watched[0]
        overhead = (
            f"the analysed window, steps {w.first}-{w.last}, is one the watch opened for slow steps: its steps are "
            "slower than the plain ones for what it caught, not only for the profiler's overhead (see the watch's "
            "windows; --step picks another window)"
        )
    if overhead is not None:
        result.notices.append(overhead)
    if facts.anomalies:
        from stepscope.analysis.findings.anomaly import anomaly_findings

        first = anomaly_findings(facts.anomalies)
    else:
        first = []
    if not facts.python_samples and not facts.host_memory:
        result.findings[:0] = first
        return result
    steps = {r.rank: [s.step for s in r.steps] for r in result.ranks}
    step_ms = {rank: median(ms) for rank, ms in profiled.items() if ms}
    findings = python_findings(result.findings, facts.python_samples, steps, step_ms)
    new = [f for f in findings if f.id == "python_hotspot"]
    kept = [f for f in findings if f.id != "python_hotspot"]
    new.extend(host_memory_findings(facts.host_memory))
    result.findings = first + rank_by_cost(kept + group_across_ranks(new))
    return result


def analyze_rank(data: RankData, *, top: int = 10, comm: iv.Intervals | None) -> RankAnalysis:
    """The per-rank sections of the result. `comm`: the rank's time in communication, a union
    (collectives.communication_intervals)."""
    gpu = data.gpu
    has_comm = bool((gpu.kind == COMMUNICATION).any())
    overlap = comm_compute_overlap(gpu) if has_comm else None
    all_gpu = data.gpu_all
    busy = iv.merge(all_gpu.start, all_gpu.end) if len(all_gpu) else None
    info = data.table.ranks.get(data.rank)
    return RankAnalysis(
        rank=data.rank,
        source=info.source if info is not None else "",
        window=WindowInfo(
            start_us=ns_to_us(data.lo),
            dur_us=ns_to_us(max(data.hi - data.lo, 0)),
            steps=len(data.steps),
            total_steps=data.all_steps,
            dropped_last_step=len(data.steps) < data.all_steps,
        ),
        temporal=temporal_breakdown(gpu),
        kernel_types=kernel_type_breakdown(gpu),
        idle_by_stream=idle_by_stream(gpu),
        overlap_pct=overlap.overlap_pct if overlap is not None else None,
        communication=overlap,
        top_kernels=top_kernels(gpu, top),
        steps=step_table(data.table, data.steps, busy, comm, effective_launch(all_gpu)),
        notes=data.notes,
        step_categories=step_categories(data, comm),
    )
