"""A whole run folder, read back: `load_run(path) -> Run`, and what the run measured outside its traces.

`Run` holds the manifest, the config, every step's metrics line, the FLOP reports, the collective counts, the
process groups each rank recorded, a DeepSpeed engine's records (`deepspeed`), the memory logs and the system samples (traces are loaded on demand: `run.traces()`). `run_facts(run)` turns them
into plain figures: step wall time over the whole run, FLOPs / TFLOP/s / MFU (or why there is none), memory
(peak, growth per step), system samples (CPU %, RSS, GPU utilisation where present) and the job's process
groups and device meshes. No torch, no rich.

A damaged artifact never stops the reading: it is left out with a note naming the file and the problem; a
damaged manifest is replaced by what the folder holds, read by its layout.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from stepscope.analysis.read.records import SAMPLES_MAX_BYTES, read_json, read_lines
from stepscope.analysis.read.source import Source, as_source
from stepscope.analysis.run._trend import MIN_TREND_PCT, MIN_TREND_STEPS, TREND_P_VALUE, Trend, step_trend
from stepscope.analysis.run.anomaly import AnomalyWindow
from stepscope.analysis.run.deepspeed import DeepSpeedFacts, DeepSpeedRecords, deepspeed_facts, read_deepspeed
from stepscope.analysis.run.groups import GroupFacts, MeshFacts, capture_evidence, job_groups
from stepscope.analysis.run.hostmem import HostMemoryFacts, host_memory_facts
from stepscope.analysis.run.plain import StepRanges, plain_lines_of, window_work_steps
from stepscope.analysis.run.python_samples import PythonProfile, python_profile
from stepscope.analysis.stats import fmean, median, quantile
from stepscope.runfolder import METRICS_NAME, ArtifactKind, Manifest
from stepscope.runfolder.manifest import LEFT_OUT
from stepscope.runfolder.payloads import (
    CommCounts,
    FlopsReport,
    HostMemory,
    MemoryRow,
    ProcessGroups,
    PythonSamples,
    StepMetrics,
    SystemRow,
    WatchRecord,
)

T = TypeVar("T")
SLOWEST_STEPS = 5
MIN_MEAN_SAMPLES = 2  # a mean of one sample is that sample: say there are too few instead


@dataclass
class Run:
    """Everything a run folder holds, decoded (traces on demand)."""

    path: Path
    manifest: Manifest
    config: dict[str, Any]
    metrics: list[StepMetrics]
    flops: list[FlopsReport]
    comm_counts: list[CommCounts]
    memory: dict[int, list[MemoryRow]]  # rank -> rows
    system: dict[int, list[SystemRow]]  # rank -> samples
    notes: list[str] = field(default_factory=list)
    process_groups: list[ProcessGroups] = field(default_factory=list)  # one record per rank that wrote one
    python_samples: list[PythonSamples] = field(default_factory=list)  # py-spy's, one per rank and window
    host_memory: list[HostMemory] = field(default_factory=list)  # tracemalloc's, one per rank and window
    deepspeed: DeepSpeedRecords | None = None  # a DeepSpeed engine's records; None: the job had no engine
    watch: list[WatchRecord] = field(default_factory=list)  # the decisions of the ranks' watch (watch=True)

    @property
    def has_traces(self) -> bool:
        return bool(self.manifest.of_kind(ArtifactKind.TRACE))

    def traces(self, step: int | None = None, progress: Any = None) -> Any:
        """The run's traces as one TraceTable (each rank's latest window, or the window ending at `step`)."""
        from stepscope.analysis.read.loader import load_trace

        return load_trace(self.path, step=step, progress=progress)


def no_traces_note(run: Run) -> str:
    """Why a run folder has no trace to analyse: the job ended before its first window, or every trace it
    indexed was left out (its notes say which and why)."""
    if any(LEFT_OUT in note for note in run.notes):
        return "the run has no trace to read: those it holds were left out (see the notes)"
    return "the run has no traces (the job ended before its first window was exported)"


def recorded_groups(path: str | Path | Source) -> dict[str, dict[str, Any]] | None:
    """The job's process groups by name ({description, ranks, backend, mesh_dim, threads, windows, and for a
    pipeline's group "pipeline": {"stage_ranks": the rank of each stage}}) as its profiled ranks recorded them in a run folder (kind `process_groups`; threads and windows: capture_evidence); None for a
    path that is not a run folder or has no record. What the collectives analysis takes as `known_groups`."""
    source = as_source(path)
    if not source.is_run_folder:
        return None
    manifest, notes = source.manifest()
    records = _process_groups(source.path, manifest, notes)
    groups, _, _ = job_groups(records)
    evidence = capture_evidence(records)
    known: dict[str, dict[str, Any]] = {
        g.name: {
            "description": g.description,
            "ranks": g.ranks,
            "backend": g.backend,
            "mesh_dim": g.mesh_dim,
            **evidence.get(g.name, {}),
        }
        for g in groups
    }
    for record in records:
        for stage in record.pipeline_stages:
            if stage.group in known:
                known[stage.group].setdefault("pipeline", {"stage_ranks": list(stage.stage_ranks)})
    return known or None


def load_run(source: str | Path | Source) -> Run:
    """Read a run folder whole. Raises InputError when `path` is not a readable run folder. A damaged manifest
    is replaced by the index of the files in the folder, with a note."""
    source = as_source(source)
    path = source.path
    manifest, notes = source.manifest()
    config = source.config(notes)
    metrics = list(read_lines(path / METRICS_NAME, StepMetrics, notes))
    flops = [
        r for a in manifest.of_kind(ArtifactKind.FLOPS) if (r := read_json(path / a.path, FlopsReport, notes))
    ]
    comm = [
        c
        for a in manifest.of_kind(ArtifactKind.COMM_COUNTS)
        if (c := read_json(path / a.path, CommCounts, notes))
    ]
    memory = {
        a.rank if a.rank is not None else 0: list(read_lines(path / a.path, MemoryRow, notes))
        for a in manifest.of_kind(ArtifactKind.MEMORY_LOG)
    }
    system = {
        a.rank if a.rank is not None else 0: list(read_lines(path / a.path, SystemRow, notes))
        for a in manifest.of_kind(ArtifactKind.SYSTEM)
    }
    groups = _process_groups(path, manifest, notes)
    samples = [
        p
        for a in manifest.of_kind(ArtifactKind.PYTHON_SAMPLES)
        if (p := read_json(path / a.path, PythonSamples, notes, SAMPLES_MAX_BYTES))
    ]
    heap = [
        h
        for a in manifest.of_kind(ArtifactKind.HOST_MEMORY)
        if (h := read_json(path / a.path, HostMemory, notes))
    ]
    samples.sort(key=lambda p: (p.rank, p.last_step))
    heap.sort(key=lambda h: (h.rank, h.last_step))
    deepspeed = read_deepspeed(path, manifest, lambda file, kind: read_json(file, kind, notes))
    watch = [
        w for a in manifest.of_kind(ArtifactKind.WATCH) for w in read_lines(path / a.path, WatchRecord, notes)
    ]
    watch.sort(key=lambda w: (w.step, w.rank))
    return Run(
        path, manifest, config, metrics, flops, comm, memory, system, notes, groups, samples, heap, deepspeed,
        watch,
    )  # fmt: skip


def _process_groups(path: Path, manifest: Manifest, notes: list[str]) -> list[ProcessGroups]:
    """Each profiled rank's record of its process groups."""
    return [
        g
        for a in manifest.of_kind(ArtifactKind.PROCESS_GROUPS)
        if (g := read_json(path / a.path, ProcessGroups, notes))
    ]


class SlowStep(msgspec.Struct):
    step: int
    wall_ms: float
    phase: str


class StepTimes(msgspec.Struct):
    """Step wall time of one rank over the whole run (metrics.jsonl).

    Plain steps are those outside the profiler's windows, neither the first step (start-up) nor a step that
    counted FLOPs or logged collectives, nor one that ran beside a window's end work (the gzip and summary of a
    trace, on any rank; see window_work_steps): their statistics are what the job costs without stepscope."""

    rank: int
    steps: int  # lines in metrics.jsonl
    plain_steps: int
    median_ms: float | None  # of plain steps
    p90_ms: float | None
    mean_ms: float | None
    traced_median_ms: float | None  # steps inside warmup/active windows (profiler overhead included)
    first_step_ms: float | None
    trend_pct: float | None  # change over the run in % of the median plain step; null unless significant
    trend_ms_per_step: float | None  # the Theil-Sen slope over the plain steps; null unless significant
    trend_p_value: float | None  # Mann-Kendall's, two-sided; null with too few plain steps to test
    trend_note: str  # what the trend is, or why none is given
    slowest: list[SlowStep]
    windows: list[list[int]]  # [first, last] active step of each profiled window of this rank
    # steps otherwise plain left out because a window's end work ran beside them (kept, and said, where leaving
    # them out would leave fewer than MIN_PLAIN_KEPT)
    overlapped_steps: int = 0
    overlap_note: str | None = None


class FlopsFacts(msgspec.Struct):
    rank: int
    step: int  # the counted step
    total_flops: int
    tflops: float | None  # FLOPs / median plain step time
    mfu: float | None
    peak: str | None  # the peak used, and its source
    steps_timed: int
    reason: str | None  # why there is no TFLOP/s or MFU figure
    spread_note: str | None = None  # why the TFLOP/s figure may not be the job's own speed (a busy machine)


class MemoryFacts(msgspec.Struct):
    rank: int
    rows: int
    first_step: int
    last_step: int
    peak_rss_bytes: int
    rss_growth_bytes_per_step: float | None  # least-squares slope over the logged steps
    peak_cuda_allocated_bytes: int | None  # the highest interval peak
    cuda_growth_bytes_per_step: float | None  # slope of allocated memory


class GpuFacts(msgspec.Struct):
    index: int
    util_mean_percent: float | None
    util_max_percent: float | None
    mem_max_bytes: int | None
    power_max_w: float | None


class SystemFacts(msgspec.Struct):
    """The system samples of one rank. CPU figures come from the samples after the first (whose CPU % covers the
    millisecond since the sampler started), and only from MIN_MEAN_SAMPLES of them on: null below, with a note."""

    rank: int
    samples: int
    seconds: float  # from the first sample to the last
    process_cpu_mean_percent: float | None
    process_cpu_max_percent: float | None
    system_cpu_mean_percent: float | None
    peak_rss_bytes: int
    gpus: list[GpuFacts]
    note: str | None  # why a figure is missing


class RunFacts(msgspec.Struct):
    """What `stepscope analyze RUN` adds from outside the traces (null sections: the run did not measure it)."""

    path: str
    run_name: str
    world_size: int
    profiled_ranks: list[int]
    schedule: dict[str, int]
    versions: dict[str, str]
    step_times: list[StepTimes]
    flops: list[FlopsFacts]
    flops_note: str | None  # why there are no FLOP figures
    memory: list[MemoryFacts]
    system: list[SystemFacts]
    notes: list[str]
    process_groups: list[GroupFacts] = []  # the job's process groups, as its profiled ranks recorded them
    meshes: list[MeshFacts] = []  # its device meshes
    process_group_notes: list[str] = []  # what a rank could not record; ranks that disagree on a group
    python_samples: list[PythonProfile] = []  # py-spy's Python functions of each rank's windows
    host_memory: list[HostMemoryFacts] = []  # tracemalloc's allocation sites of each rank, growing ones first
    deepspeed: DeepSpeedFacts | None = (
        None  # a DeepSpeed engine's job: its configuration, FLOPs, comms, memory
    )
    # the windows the watch opened by itself (watch=True), each against a plain window (analysis/run/anomaly.py)
    anomalies: list[AnomalyWindow] = []


def run_facts(run: Run) -> RunFacts:
    manifest = run.manifest
    by_rank: dict[int, list[StepMetrics]] = {}
    for line in run.metrics:
        by_rank.setdefault(line.rank, []).append(line)
    flops_note = None
    if not run.flops:
        flops_note = (
            "no FLOP count in this run: set flop_counter_step (or --flop-counter-step) to get FLOPs, TFLOP/s "
            "and MFU"
        )
    groups, meshes, group_notes = job_groups(run.process_groups)
    busy = window_work_steps(manifest)
    return RunFacts(
        path=str(run.path),
        run_name=manifest.run_name,
        world_size=manifest.world_size,
        profiled_ranks=list(manifest.profiled_ranks),
        schedule=dict(manifest.schedule),
        versions=dict(manifest.versions),
        step_times=[_step_times(rank, lines, busy) for rank, lines in sorted(by_rank.items())],
        flops=[_flops_facts(r) for r in sorted(run.flops, key=lambda r: r.rank)],
        flops_note=flops_note,
        memory=[m for rank, rows in sorted(run.memory.items()) if (m := _memory_facts(rank, rows))],
        system=[s for rank, rows in sorted(run.system.items()) if (s := _system_facts(rank, rows))],
        notes=list(run.notes),
        process_groups=groups,
        meshes=meshes,
        process_group_notes=group_notes,
        python_samples=[python_profile(p) for p in run.python_samples],
        host_memory=host_memory_facts(run.host_memory),
        deepspeed=deepspeed_facts(run.deepspeed, run.flops, run.memory)
        if run.deepspeed is not None
        else None,
    )


ACTIVE_PHASES = ("record", "record_and_save")


def _windows(lines: list[StepMetrics]) -> list[list[int]]:
    """[first, last] active step of each window a rank recorded, from the phases of its steps (sorted by step):
    the manifest's schedule holds one window of an on-demand run, the steps hold them all."""
    out: list[list[int]] = []
    previous: StepMetrics | None = None
    for line in lines:
        if line.phase in ACTIVE_PHASES:
            opens = previous is None or previous.phase != "record" or previous.step != line.step - 1
            if opens:
                out.append([line.step, line.step])
            else:
                out[-1][1] = line.step
        previous = line
    return out


def _step_times(rank: int, lines: list[StepMetrics], busy: StepRanges | None = None) -> StepTimes:
    lines = sorted(lines, key=lambda m: m.step)
    plain_lines, left_out, overlap_note = plain_lines_of(lines, busy or StepRanges())
    plain = [m.wall_ms for m in plain_lines]
    traced = [m.wall_ms for m in lines if m.phase != "none"]
    first = next((m.wall_ms for m in lines if m.step == 0), None)
    trend = step_trend([m.step for m in plain_lines], plain)
    reported = trend is not None and trend.reported
    slowest = sorted(lines, key=lambda m: -m.wall_ms)[:SLOWEST_STEPS]
    return StepTimes(
        rank=rank,
        steps=len(lines),
        plain_steps=len(plain),
        median_ms=median(plain) if plain else None,
        p90_ms=quantile(plain, 0.9) if plain else None,
        mean_ms=fmean(plain) if plain else None,
        traced_median_ms=median(traced) if traced else None,
        first_step_ms=first,
        trend_pct=trend.change_pct if trend is not None and reported else None,
        trend_ms_per_step=trend.slope_ms_per_step if trend is not None and reported else None,
        trend_p_value=trend.p_value if trend is not None else None,
        trend_note=_trend_note(trend, plain_lines),
        slowest=[SlowStep(m.step, m.wall_ms, m.phase) for m in slowest],
        windows=_windows(lines),
        overlapped_steps=left_out,
        overlap_note=overlap_note,
    )


def _trend_note(trend: Trend | None, plain: list[StepMetrics]) -> str:
    if trend is None:
        return f"no trend: {len(plain)} plain steps, {MIN_TREND_STEPS} needed"
    p = "p < 0.001" if trend.p_value < 0.001 else f"p = {trend.p_value:.2g}"
    over = f"over {trend.steps} plain steps ({plain[0].step}-{plain[-1].step}; Mann-Kendall {p})"
    if trend.reported:
        return (
            f"trend {trend.change_pct:+.0f}% of the median step: {trend.change_ms:+.3g} ms "
            f"({trend.slope_ms_per_step:+.3g} ms per step) {over}"
        )
    if trend.p_value >= TREND_P_VALUE:
        return f"no significant trend {over}"
    return f"no trend larger than {MIN_TREND_PCT:g}% of the median step {over}"


def _flops_facts(report: FlopsReport) -> FlopsFacts:
    t = report.throughput
    reason = report.note
    if t is None and reason is None:
        reason = report.no_throughput_reason or "too few undisturbed steps for a TFLOP/s figure"
    elif t is not None and t.mfu is None:
        reason = t.no_mfu_reason
    peak = None
    if t is not None and t.peak is not None:
        fmt = f" {t.peak.dtype}" if t.peak.dtype else ""
        peak = f"{t.peak.tflops:g} TFLOP/s ({t.peak.device}{fmt}; {t.peak.source})"
    return FlopsFacts(
        rank=report.rank,
        step=report.step,
        total_flops=report.total_flops,
        tflops=t.tflops if t is not None else None,
        mfu=t.mfu if t is not None else None,
        peak=peak,
        steps_timed=t.steps_timed if t is not None else 0,
        reason=reason,
        spread_note=t.spread_note if t is not None else None,
    )


def _slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ys over xs; None with fewer than two distinct xs."""
    if len(xs) < 2:
        return None
    mx, my = fmean(xs), fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    if var == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var


def _memory_facts(rank: int, rows: list[MemoryRow]) -> MemoryFacts | None:
    if not rows:
        return None
    steps = [float(r.step) for r in rows]
    cuda = [r for r in rows if r.cuda_allocated_bytes is not None]
    peaks = [r.cuda_peak_allocated_bytes for r in cuda if r.cuda_peak_allocated_bytes is not None]
    return MemoryFacts(
        rank=rank,
        rows=len(rows),
        first_step=rows[0].step,
        last_step=rows[-1].step,
        peak_rss_bytes=max(r.rss_bytes for r in rows),
        rss_growth_bytes_per_step=_slope(steps, [float(r.rss_bytes) for r in rows]),
        peak_cuda_allocated_bytes=max(peaks) if peaks else None,
        cuda_growth_bytes_per_step=(
            _slope([float(r.step) for r in cuda], [float(r.cuda_allocated_bytes or 0) for r in cuda])
            if cuda
            else None
        ),
    )


def _stat(values: list[float], fn: Callable[[list[float]], float]) -> float | None:
    return fn(values) if values else None


def _system_facts(rank: int, rows: list[SystemRow]) -> SystemFacts | None:
    if not rows:
        return None
    gpus: dict[int, list[Any]] = {}
    for row in rows:
        for gpu in row.gpus:
            gpus.setdefault(gpu.index, []).append(gpu)
    gpu_facts = []
    for index, samples in sorted(gpus.items()):
        util = [float(g.util_percent) for g in samples if g.util_percent is not None]
        if len(util) < MIN_MEAN_SAMPLES:
            util = []
        mem = [float(g.mem_used_bytes) for g in samples if g.mem_used_bytes is not None]
        power = [float(g.power_w) for g in samples if g.power_w is not None]
        gpu_facts.append(
            GpuFacts(
                index=index,
                util_mean_percent=_stat(util, fmean),
                util_max_percent=_stat(util, max),
                mem_max_bytes=int(max(mem)) if mem else None,
                power_max_w=_stat(power, max),
            )
        )
    timed = rows[1:]  # each of these has the CPU % of the interval since the sample before
    enough = len(timed) >= MIN_MEAN_SAMPLES
    note = None
    if not enough:
        and_gpu = " and GPU utilisation" if any(g.util_mean_percent is None for g in gpu_facts) else ""
        note = (
            f"too few samples for CPU{and_gpu} figures ({len(rows)}; {MIN_MEAN_SAMPLES + 1} needed): sample more "
            "often (system_sample_interval) or for longer"
        )
    return SystemFacts(
        rank=rank,
        samples=len(rows),
        seconds=rows[-1].t_s - rows[0].t_s,
        process_cpu_mean_percent=fmean(r.process_cpu_percent for r in timed) if enough else None,
        process_cpu_max_percent=max(r.process_cpu_percent for r in timed) if enough else None,
        system_cpu_mean_percent=fmean(r.system_cpu_percent for r in timed) if enough else None,
        peak_rss_bytes=max(r.rss_bytes for r in rows),
        gpus=gpu_facts,
        note=note,
    )
