"""Terminal rendering of an AnalysisResult (`stepscope analyze`). Formats only; every number comes computed."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.padding import Padding
from rich.text import Text

from stepscope.analysis.analyze import AnalysisResult, RankAnalysis
from stepscope.analysis.findings import Finding
from stepscope.report import columns as col
from stepscope.report._critical_path import job_path_table, path_line
from stepscope.report._expert_tensor import expert_table, tensor_table
from stepscope.report._fsdp import fsdp_table
from stepscope.report._pipeline import pipeline_line, pipeline_table
from stepscope.report._savings import combined_lines, saving_text
from stepscope.report.model import Table, table
from stepscope.report.tables import (
    anomaly_table,
    collectives_table,
    dimensions_table,
    gpu_time_split_table,
    rank_steps_table,
    stragglers_table,
)
from stepscope.report.terminal import fit_table, fmt_pct, fmt_us, markup_safe, plain
from stepscope.units import fmt_members, fmt_ms, fmt_ranks, fmt_tflops

if TYPE_CHECKING:  # (only run folders have RunFacts: a trace file needs none of the run folder's modules)
    from stepscope.analysis.per_rank.breakdown import KernelTypes, TopKernel
    from stepscope.analysis.per_rank.idle import StreamIdle
    from stepscope.analysis.per_rank.steps import StepRow
    from stepscope.analysis.run import DeepSpeedFacts, RunFacts
    from stepscope.analysis.run.folder import MemoryFacts, SystemFacts

SEVERITY_STYLE = {"high": "bold red", "medium": "yellow", "low": "cyan", "info": "dim"}


class AnalysisReport:
    """Per-rank breakdowns, then the collectives and the cross-rank view, then the findings (a rich
    renderable)."""

    def __init__(self, result: AnalysisResult, *, wide: bool = False) -> None:
        self.result = result
        self.wide = wide

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield from _analysis_parts(self.result, self.wide)


def _analysis_parts(result: AnalysisResult, wide: bool) -> Iterator[RenderableType]:
    """Everything but the notes, which the CLI prints on stderr."""
    if result.run is not None:
        yield from _run_parts(result.run)
    for rank in result.ranks:
        yield from _rank_parts(rank, wide)
    collectives = [c for r in result.ranks for c in r.collectives]
    if collectives:
        yield fit_table(collectives_table(collectives, title="Collectives in the window"))
        sources = sorted({c.time_source for c in collectives if c.time_source})
        yield (
            f"[dim]timed on: {markup_safe(', '.join(sources)) or 'not recorded'}; waiting: for the last rank to "
            "arrive; bus GB/s: nccl-tests' bus bandwidth over the transfer time[/dim]"
        )
        yield Text("")
    if result.critical_path is not None and result.critical_path.segments:
        yield fit_table(job_path_table(result.critical_path))
        yield f"[dim]{markup_safe(path_line(result.critical_path))}[/dim]"
        yield Text("")
    if result.dimensions is not None:
        yield fit_table(dimensions_table(result.dimensions, title="Communication by dimension"))
    if result.fsdp is not None:
        units = fsdp_table(result.fsdp, title="FSDP units")
        yield fit_table(units)
        yield f"[dim]{markup_safe(units.caption)}[/dim]"
        yield Text("")
    shown = [
        *([expert_table(result.expert, title="Expert parallel")] if result.expert is not None else []),
        *([tensor_table(result.tensor, title="Tensor parallel")] if result.tensor is not None else []),
    ]
    for part in shown:
        yield fit_table(part)
        yield f"[dim]{markup_safe(part.caption)}[/dim]"
        yield Text("")
    if result.pipeline is not None:
        yield fit_table(pipeline_table(result.pipeline, title="Pipeline stages"))
        yield f"[dim]{markup_safe(pipeline_line(result.pipeline))}[/dim]"
        for note in result.pipeline.notes:
            yield f"[dim]{markup_safe(note)}[/dim]"
        yield Text("")
    if result.cross_rank is not None:
        s = result.cross_rank
        yield fit_table(rank_steps_table(s, title="Ranks"))
        a = s.alignment
        if a is not None and a.method == "collectives":
            offsets = ", ".join(
                f"rank {c.rank} {c.offset_us / 1e3:+.3f} ms" for c in a.ranks if c.rank != a.reference_rank
            )
            yield (
                f"clocks aligned on {a.matched} matched collectives (reference rank {a.reference_rank}): {offsets}; "
                f"collective ends then agree within {fmt_us(a.end_spread_p50_us)} (median), "
                f"{fmt_us(a.end_spread_p90_us)} (p90), {fmt_us(a.end_spread_max_us)} (max)"
            )
        if s.slowest_rank is not None:
            yield (
                f"longest mean step: rank {s.slowest_rank}, {fmt_us(s.slowest_step_us)} per step, "
                f"{fmt_us(s.spread_us)} ({fmt_pct(s.spread_pct)}) more than rank {s.fastest_rank}"
                + (
                    " (the ranks' steps end together at the collectives: the rank that holds the others back is "
                    "the straggler, below)"
                    if result.straggler is not None
                    else ""
                )
            )
        st = result.straggler
        if st is not None:
            cause = ""
            if st.cause is not None:
                what = {
                    "op": st.cause.name,
                    "outside_regions": "step less waiting, outside regions and ops",
                }.get(st.cause.phase, st.cause.phase.replace("_", " "))
                cause = (
                    f"; cause: {markup_safe(what)} {st.cause.rank_ms_per_step:.1f} ms per step against "
                    f"{st.cause.others_ms_per_step:.1f} ms on the others"
                )
            yield (
                f"[bold]straggler: rank {st.rank}[/bold], the others wait {st.delay_ms_per_step:.1f} ms per step "
                f"for it ({fmt_pct(st.delay_pct)} of the step; last in {st.last_in_steps} of {st.steps} steps){cause}"
            )
            others = sorted({g.rank for g in result.stragglers} - {st.rank})
            if others:
                yield f"also late beyond jitter: rank{'s' if len(others) > 1 else ''} {fmt_ranks(others)} (below)"
        elif result.waiting_by_group:
            yield "straggler: none named (none is shown to be late beyond jitter; the waiting below says why)"
        else:
            yield "straggler: none (no rank keeps the others waiting)"
        for w in result.waiting_by_group:
            members = fmt_members(w.ranks)
            yield (
                f"waiting in {markup_safe(w.dim or w.group or 'unknown')} {members}: {w.waiting_ms_per_step:.1f} ms "
                f"per step ({fmt_pct(w.waiting_pct)} of the step): {w.verdict}; {markup_safe(w.note)}"
            )
        if any(g.group is not None for g in result.stragglers):
            stragglers = stragglers_table(result.stragglers, title="Stragglers by process group")
            yield fit_table(stragglers)
            yield f"[dim]{markup_safe(stragglers.caption)}[/dim]"
        yield Text("")
    yield "[bold]Findings[/bold]" if result.findings else "[bold]Findings[/bold]: none"
    for f in result.findings:
        style = SEVERITY_STYLE.get(f.severity, "")
        yield f"[{style}]{f.severity.upper():6}[/{style}]{_where(f)} {f.id}: {markup_safe(f.message)}"
        evidence = ", ".join(f"{k}={v}" for k, v in f.evidence.items() if v is not None)
        if len(f.ranks) > 1:
            evidence = f"{_across(f)}; {evidence}"
        if f.saving_ms_per_step is not None:
            evidence = f"{saving_text(f)}: {f.saving_note}; {evidence}"
        yield Padding(Text(plain(evidence), style="dim"), (0, 0, 0, 8))  # wrapped lines keep the indent
    for line in combined_lines(result.ranks):
        yield Padding(Text(plain(line)), (0, 0, 0, 8))


def _where(f: Finding) -> str:
    if len(f.ranks) > 1:
        return f" ranks {fmt_ranks(f.ranks)}"
    return "" if f.rank is None else f" rank {f.rank}"


def _across(f: Finding) -> str:
    """A finding on several ranks: its spread, and whose figures the message gives."""
    spread = f.cost_range_ms_per_step
    cost = f"{fmt_ms(spread[0])} to {fmt_ms(spread[1])} per step across the ranks; " if spread else ""
    costliest = ", the costliest" if spread else ""
    return f"{cost}figures of rank {f.rank}{costliest}"


def _rank_parts(r: RankAnalysis, wide: bool) -> Iterator[RenderableType]:
    w = r.window
    dropped = ", last step dropped" if w.dropped_last_step else ""
    steps = (
        f"{w.steps} of {w.total_steps} steps{dropped}" if w.total_steps else "whole trace (no ProfilerStep)"
    )
    yield f"[bold]Rank {r.rank}[/bold]  {markup_safe(r.source)}  [dim]{steps}, {fmt_us(w.dur_us)}[/dim]"
    if r.temporal is not None:
        yield fit_table(gpu_time_split_table(r.temporal, title="GPU time (HTA definitions)"))
    if r.kernel_types is not None:
        yield fit_table(_kernel_type_table(r.kernel_types))
        combos = ", ".join(f"{' + '.join(c.types)} {fmt_pct(c.pct)}" for c in r.kernel_types.combos)
        yield f"[dim]GPU busy time by what runs together: {markup_safe(combos)}[/dim]"
    if r.communication is not None:
        c = r.communication
        yield (
            f"communication {fmt_us(c.comm_us)}, overlapped with computation {fmt_pct(r.overlap_pct)}, "
            f"exposed {fmt_us(c.exposed_us)}"
        )
    if r.idle_by_stream:
        yield fit_table(_idle_table(r.idle_by_stream))
    if r.top_kernels:
        yield fit_table(_top_kernel_table(r.top_kernels), wide=wide)
    if r.steps:
        yield fit_table(_steps_table(r.steps))
    yield Text("")


def _kernel_type_table(kernel_types: KernelTypes) -> Table:
    return table(
        "kernel-types",
        [col.KERNEL_TYPE, col.CALLS, col.TOTAL, col.BUSY, col.PCT_OF_SPAN],
        ([k.type, k.count, k.total_us, k.busy_us, k.busy_pct] for k in kernel_types.by_type if k.count),
        title="Kernel types",
    )


def _idle_table(streams: Sequence[StreamIdle]) -> Table:
    return table(
        "idle-streams",
        [
            col.STREAM,
            col.EVENTS,
            col.BUSY,
            col.IDLE_US,
            col.HOST_WAIT,
            col.LAUNCH_GAP,
            col.OTHER_IDLE,
        ],
        (
            [
                f"{s.device}:{s.stream}",
                s.events,
                s.busy_us,
                s.idle_us,
                s.host_wait_us,
                s.kernel_wait_us,
                s.other_us,
            ]
            for s in streams
        ),
        title="Idle time per stream",
    )


def _top_kernel_table(kernels: Sequence[TopKernel]) -> Table:
    return table(
        "top-gpu-kernels",
        [col.KERNEL, col.CALLS, col.TOTAL, col.PCT_GPU_TIME],
        ([k.name, k.count, k.total_us, k.pct] for k in kernels),
        title="Top GPU kernels",
    )


def _steps_table(steps: Sequence[StepRow]) -> Table:
    return table(
        "steps",
        [
            col.STEP_TEXT,
            col.STEP_TIME,
            col.GPU_BUSY,
            col.DATA_LOADER,
            col.FORWARD,
            col.BACKWARD,
            col.OPTIMIZER,
            col.COMMUNICATION,
        ],
        (
            [
                s.step,
                s.dur_us,
                s.gpu_busy_pct,
                s.dataloader_us,
                s.forward_us,
                s.backward_us,
                s.optimizer_us,
                s.comm_us,
            ]
            for s in steps
        ),
        title="Steps",
    )


_STEP_PHASE = {"none": "outside the windows"}  # metrics.jsonl's phase of a step the profiler did not record


def _deepspeed_parts(facts: DeepSpeedFacts) -> Iterator[RenderableType]:
    """A DeepSpeed engine's job: its settings, DeepSpeed's FLOPs, comms and memory (the page's DeepSpeed section)."""
    from stepscope.report._deepspeed import flops_lines, tables

    for line in flops_lines(facts):
        yield Text(line)
    for t in tables(facts):
        yield fit_table(t)
    for note in facts.notes:
        yield Text(plain(note), style="dim")


def _run_parts(run: RunFacts) -> Iterator[RenderableType]:
    """The run as a whole: step times, FLOPs / MFU, memory and system samples (from outside the traces)."""
    ranks = ", ".join(str(r) for r in run.profiled_ranks) or "-"
    yield f"[bold]Run[/bold] {markup_safe(run.run_name)}  [dim]world size {run.world_size}, profiled ranks {ranks}[/dim]"
    if run.anomalies:
        yield from _anomaly_parts(run)
    if run.step_times:
        yield fit_table(
            table(
                "step-times",
                [
                    col.RANK,
                    col.STEPS,
                    col.PLAIN_STEPS,
                    col.MEDIAN_STEP,
                    col.P90_STEP,
                    col.IN_WINDOWS,
                    col.TREND,
                ],
                (
                    [
                        t.rank,
                        t.steps,
                        t.plain_steps,
                        t.median_ms,
                        t.p90_ms,
                        t.traced_median_ms,
                        f"{t.trend_pct:+.0f}%" if t.trend_pct is not None else None,
                    ]
                    for t in run.step_times
                ),
                title="Step time over the whole run",
            )
        )
        yield Text(
            "median, p90 and trend: of the plain steps (outside the profiled windows, neither the first step nor "
            "one that counted FLOPs or logged collectives, nor one beside a window's end work); in windows: the "
            "median traced step",
            style="dim",
        )
        for overlap in dict.fromkeys(t.overlap_note for t in run.step_times if t.overlap_note):
            yield Text(overlap, style="dim")
        for t in run.step_times:
            slowest = ", ".join(
                f"{s.step} ({fmt_ms(s.wall_ms)}, {markup_safe(_STEP_PHASE.get(s.phase, s.phase))})"
                for s in t.slowest[:3]
            )
            yield f"[dim]rank {t.rank} slowest steps: {slowest}[/dim]"
            yield Text(plain(f"rank {t.rank} {t.trend_note}"), style="dim")
        windows = run.step_times[0].windows
        if windows:
            marked = ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in windows)
            yield f"[dim]profiled windows (active steps): {marked}[/dim]"
    if run.flops:
        for f in run.flops:
            line = f"rank {f.rank}: {f.total_flops:,} FLOPs per step (counted at step {f.step})"
            if f.tflops is not None:
                line += f", {fmt_tflops(f.tflops)} over {f.steps_timed} steps"
            if f.mfu is not None:
                line += f", MFU {100 * f.mfu:.2f}% of {f.peak}"
            yield Text(line)
            for note in (f.spread_note, f.reason):
                if note:
                    yield Text(f"  {plain(note)}", style="dim")
    elif run.flops_note:
        yield Text(plain(run.flops_note), style="dim")
    if run.deepspeed is not None:
        yield from _deepspeed_parts(run.deepspeed)
    if run.memory:
        yield fit_table(_run_memory_table(run.memory))
    if run.system:
        yield fit_table(_system_table(run.system))
        for sy in run.system:
            if sy.note:
                yield Text(f"  rank {sy.rank}: {plain(sy.note)}", style="dim")
    yield Text("")


def _anomaly_parts(run: RunFacts) -> Iterator[RenderableType]:
    """The windows the watch opened by itself, first: what it saw, what slowed the steps, how that was checked."""
    from stepscope.analysis.run.anomaly import work_line

    yield "[bold]Windows the watch opened[/bold] [dim](watch=True: steps slower than the job's own noise)[/dim]"
    for window in run.anomalies:
        asked = "" if window.asked_by is None else f"rank {window.asked_by}'s watch: "
        yield f"[bold]steps {window.first}-{window.last}[/bold] [dim]({asked}{markup_safe(window.why)})[/dim]"
        yield markup_safe(window.message)
        if window.ranks:
            yield fit_table(anomaly_table(window))
        if line := work_line(window):
            yield f"[dim]{markup_safe(line)}[/dim]"
        yield f"[dim]checked: {markup_safe(window.check)}[/dim]"
        for note in window.notes:
            yield f"[dim]{markup_safe(note)}[/dim]"
        yield Text("")


def _run_memory_table(memory: Sequence[MemoryFacts]) -> Table:
    """The memory log of each rank: its peaks and how fast memory grew per step (a least-squares slope)."""
    return table(
        "run-memory",
        [
            col.RANK,
            col.LOGGED_STEPS,
            col.PEAK_RSS,
            col.RSS_PER_STEP,
            col.PEAK_CUDA_ALLOCATED,
            col.CUDA_PER_STEP,
        ],
        (
            [
                m.rank,
                f"{m.first_step}-{m.last_step}",
                m.peak_rss_bytes,
                m.rss_growth_bytes_per_step,
                m.peak_cuda_allocated_bytes,
                m.cuda_growth_bytes_per_step,
            ]
            for m in memory
        ),
        title="Memory over the run",
    )


def _system_table(system: Sequence[SystemFacts]) -> Table:
    """The system samples of each rank: the process' CPU, its peak RSS, and each GPU's utilisation."""
    gpus = [
        ", ".join(
            f"gpu{g.index} {g.util_mean_percent:.0f}% mean / {g.util_max_percent:.0f}% max"
            for g in sy.gpus
            if g.util_mean_percent is not None and g.util_max_percent is not None
        )
        or None
        for sy in system
    ]
    shown = any(gpus)
    return table(
        "run-system",
        [
            col.RANK,
            col.SAMPLES,
            col.SAMPLED_FOR,
            col.PROCESS_CPU_MEAN,
            col.PROCESS_CPU_MAX,
            col.PEAK_RSS,
            *([col.GPU_UTILISATION] if shown else []),
        ],
        (
            [
                sy.rank,
                sy.samples,
                sy.seconds * 1e6,
                sy.process_cpu_mean_percent,
                sy.process_cpu_max_percent,
                sy.peak_rss_bytes,
                *([gpu] if shown else []),
            ]
            for sy, gpu in zip(system, gpus, strict=True)
        ),
        title="System samples",
    )
