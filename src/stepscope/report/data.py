"""Everything the HTML report shows, computed once: `collect_report(path) -> ReportData` (no rendering here).

The report is a view of `analyze` (findings, breakdowns, collectives, ranks), of `summary` (top ops and kernels,
more rows than the terminal shows) and, for a run folder, of the series the run recorded outside its traces:
step wall times over the whole run, the memory log, the system samples, FLOPs per module, the memory timelines
and snapshots. Series are downsampled so that the page stays small whatever the length of the run.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from stepscope.analysis.analyze import AnalysisResult, analyze, attach_run
from stepscope.analysis.memory.model import MemoryReport
from stepscope.analysis.memory.timeline import downsample
from stepscope.analysis.ops import OpsResult
from stepscope.analysis.options import AnalysisOptions, with_changes
from stepscope.analysis.per_rank.summary import Summary, summarize
from stepscope.analysis.read.source import Source, as_source
from stepscope.analysis.read.table import RankInfo, TraceTable
from stepscope.analysis.run.folder import Run, load_run, no_traces_note, recorded_groups, run_facts
from stepscope.analysis.run.python_samples import Flame, flame
from stepscope.errors import StepscopeError
from stepscope.runfolder import ArtifactKind
from stepscope.runfolder.payloads import FlopsReport

REPORT_SCHEMA = "stepscope.report/1"
TOP_ROWS = 200  # ops and kernels per rank in the report's tables
MAX_POINTS = 600  # points per series (steps, memory rows, system samples) after downsampling
MAX_MEMORY_FILES = 4  # memory timelines / snapshots analysed (the latest ones)


class StepPoint(msgspec.Struct):
    rank: int
    step: int
    wall_ms: float
    phase: str  # none | warmup | record | record_and_save
    # wall_ms + the training thread's time in stepscope after the step (a window's end, a FLOP count's report);
    # null: under 1 ms
    whole_ms: float | None = None


class MemoryPoint(msgspec.Struct):
    rank: int
    step: int
    rss_bytes: int
    cuda_allocated_bytes: int | None
    cuda_reserved_bytes: int | None
    cuda_peak_allocated_bytes: int | None


class SystemPoint(msgspec.Struct):
    rank: int
    t_s: float
    process_cpu_percent: float | None  # null at a rank's first sample: its CPU % covers no time
    system_cpu_percent: float | None
    rss_bytes: int
    gpu: int | None  # NVML index of the GPU the next fields describe (one row per GPU)
    gpu_util_percent: float | None
    gpu_mem_bytes: int | None
    gpu_power_w: float | None


class TraceFile(msgspec.Struct):
    rank: int | None
    step: int | None  # the last step of the window it holds (run folders)
    path: str  # absolute
    bytes: int


class MemoryFile(msgspec.Struct):
    kind: str  # memory_timeline | memory_snapshot
    rank: int | None
    step: int | None
    path: str
    report: MemoryReport | None
    error: str | None  # why it could not be read


class RunSeries(msgspec.Struct):
    """What a run folder recorded outside its traces, as series for charts."""

    steps: list[StepPoint]
    windows: list[list[int]]  # [first, last] active step of each profiled window
    memory: list[MemoryPoint]
    system: list[SystemPoint]
    flops: list[FlopsReport]
    memory_files: list[MemoryFile]
    config: dict[str, Any]
    python_flames: list[Flame] = []  # py-spy's samples of each rank's latest window, as flame-graph boxes


class ReportData(msgspec.Struct):
    """The document the HTML page is rendered from."""

    schema: str
    source: str  # the path the report is of
    title: str
    generated: str  # UTC, ISO 8601
    versions: dict[str, str]
    devices: list[str]  # device names the traces list (deviceProperties)
    world_sizes: list[int]  # world sizes the traces' distributedInfo gives
    analysis: AnalysisResult
    summary: Summary | None
    run: RunSeries | None
    traces: list[TraceFile]
    notes: list[str]
    ops: OpsResult | None = None  # each op against the roofline (a run recorded with shapes, or --roofline)


def collect_report(
    path: str | Path | Source,
    options: AnalysisOptions | None = None,
    *,
    table: TraceTable | None = None,
    progress: Any = None,
    **changes: Any,
) -> ReportData:
    """Analyse PATH (a run folder, a trace, or a folder of traces) for the report, with `options` (or the
    defaults with `changes`: AnalysisOptions' fields) and a run folder's config.yaml patterns before their
    `comm_patterns`.

    `table`: the traces, already loaded; otherwise they are analysed as `analyze_path` analyses them, each
    rank's summary made beside its analysis (`progress`: as there)."""
    from stepscope._version import __version__
    from stepscope.analysis.analyze import SCHEMA
    from stepscope.analysis.service import attach_anomalies

    options = with_changes(options, changes)
    source = as_source(path)
    options = options.but(comm_patterns=source.comm_patterns(options.comm_patterns))  # (a run folder's first)
    path = source.path
    run: Run | None = load_run(source) if source.is_run_folder else None
    notes: list[str] = []
    infos: list[RankInfo] = []
    summary: Summary | None = None
    if table is not None:
        # a run folder's record of its process groups puts each collective in its group, as analyze's does
        known = recorded_groups(source) if run is not None else None
        result = analyze(table, options, known_groups=known)
        summary = summarize(table, top=TOP_ROWS)
        infos = [info for _, info in sorted(table.ranks.items())]
    elif run is None or run.has_traces:
        from stepscope.analysis.parallel import analyze_input

        done = analyze_input(source, options, progress=progress, summary_top=TOP_ROWS)
        result, summary = done.result, done.summary(TOP_ROWS)
        infos = [x.info for _, x in sorted(done.ranks.items())]
    else:
        note = no_traces_note(run) if run is not None else "no traces"
        result = AnalysisResult(SCHEMA, [], None, None, [], [note])
    versions = {"stepscope": __version__}
    title = path.name or str(path)
    if run is not None:
        facts = run_facts(run)
        attach_anomalies(source, run, facts, options, result)
        attach_run(result, facts)
        versions = {**dict(run.manifest.versions), "report": __version__}
        title = run.manifest.run_name or title
        notes.extend(n for n in run.notes if n not in result.notices)  # (a note the loader gave too: once)
    ops = None
    if result.ranks and (options.roofline or (run is not None and source.config([]).get("record_shapes"))):
        from stepscope.analysis.service import ops_analysis

        ops = ops_analysis(source, options)
    return ReportData(
        schema=REPORT_SCHEMA,
        source=str(path),
        title=title,
        generated=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        versions=versions,
        devices=_devices(infos),
        world_sizes=sorted({i.world_size for i in infos if i.world_size}),
        analysis=result,
        summary=summary,
        run=_series(run) if run is not None else None,
        traces=_trace_files(path, run, infos),
        notes=notes,
        ops=ops,
    )


def _devices(infos: list[RankInfo]) -> list[str]:
    names: list[str] = []
    for info in infos:
        for prop in info.device_properties:
            name = prop.get("name")
            if isinstance(name, str) and name and name not in names:
                names.append(name)
    return names


def _trace_files(path: Path, run: Run | None, infos: list[RankInfo]) -> list[TraceFile]:
    if run is not None:
        out = []
        for a in run.manifest.of_kind(ArtifactKind.TRACE):
            file = path / a.path
            out.append(TraceFile(a.rank, a.step, str(file.resolve()), _size(file)))
        return out
    return [
        TraceFile(info.rank, None, str(Path(info.source).resolve()), _size(Path(info.source)))
        for info in infos
        if info.source
    ]


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _thin(n: int, max_points: int = MAX_POINTS) -> np.ndarray:
    """Indices of at most `max_points` evenly spread rows (the first and last kept)."""
    if n <= max_points:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, max_points).round().astype(np.int64))


def _series(run: Run) -> RunSeries:
    facts = run_facts(run)
    windows = facts.step_times[0].windows if facts.step_times else []
    steps: list[StepPoint] = []
    by_rank: dict[int, list[Any]] = {}
    for line in run.metrics:
        by_rank.setdefault(line.rank, []).append(line)
    for rank, lines in sorted(by_rank.items()):
        lines.sort(key=lambda m: m.step)
        # (downsampled by the whole time: a step's stall is its bucket's peak, which downsample keeps)
        whole = np.array([m.wall_ms + (m.monitor_ms or 0.0) for m in lines], dtype=float)
        for i in downsample(whole, MAX_POINTS):
            m = lines[int(i)]
            stall = round(m.wall_ms + m.monitor_ms, 4) if m.monitor_ms is not None else None
            steps.append(StepPoint(rank, m.step, round(m.wall_ms, 4), m.phase, stall))
    memory = []
    for rank, rows in sorted(run.memory.items()):
        for i in _thin(len(rows)):
            r = rows[int(i)]
            memory.append(
                MemoryPoint(
                    rank,
                    r.step,
                    r.rss_bytes,
                    r.cuda_allocated_bytes,
                    r.cuda_reserved_bytes,
                    r.cuda_peak_allocated_bytes,
                )
            )
    system = []
    for rank, samples in sorted(run.system.items()):
        for i in _thin(len(samples)):
            s = samples[int(i)]
            timed = i > 0
            base = (
                rank,
                round(s.t_s, 3),
                s.process_cpu_percent if timed else None,
                s.system_cpu_percent if timed else None,
                s.rss_bytes,
            )
            if not s.gpus:
                system.append(SystemPoint(*base, None, None, None, None))
            for g in s.gpus:
                system.append(SystemPoint(*base, g.index, g.util_percent, g.mem_used_bytes, g.power_w))
    return RunSeries(
        steps=steps,
        windows=windows,
        memory=memory,
        system=system,
        flops=sorted(run.flops, key=lambda f: f.rank),
        memory_files=_memory_files(run),
        config=run.config,
        python_flames=[flame(p) for p in _latest_per_rank(run.python_samples)],
    )


def _latest_per_rank(samples: list[Any]) -> list[Any]:
    latest: dict[int, Any] = {}
    for p in samples:
        if p.rank not in latest or p.last_step > latest[p.rank].last_step:
            latest[p.rank] = p
    return [latest[r] for r in sorted(latest)]


def _memory_files(run: Run) -> list[MemoryFile]:
    from stepscope.analysis.memory.snapshot import analyze_memory_file

    out = []
    for kind in (ArtifactKind.MEMORY_TIMELINE, ArtifactKind.MEMORY_SNAPSHOT):
        artifacts = sorted(run.manifest.of_kind(kind), key=lambda a: (a.step or 0, a.rank or 0))
        for a in artifacts[-MAX_MEMORY_FILES:]:
            file = run.path / a.path
            try:
                report, error = analyze_memory_file(file, top=5, max_points=300), None
            except (StepscopeError, OSError) as exc:
                report, error = None, str(exc)
            out.append(MemoryFile(str(kind), a.rank, a.step, str(file.resolve()), report, error))
    return out
