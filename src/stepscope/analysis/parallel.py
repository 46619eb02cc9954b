"""`analyze_path`: `analyze` for many files, one rank per task, on a pool of local processes or a Dask cluster.

A folder (or run folder) of per-rank traces is analysed file by file: each task loads one file, analyses its
rank on its own (`analyze_rank_part`) and sends back only the small `RankPart` (sections, findings,
collective instances, a summary for the cross-rank view), never the rows. The parent then gives every file its
rank (the loader's rules: declared ranks first, the lowest free ranks for the rest) and runs the cross-rank
analysis on the parts (`combine_ranks`). Memory is bounded by workers x one rank; the result is the same
whichever executor ran the tasks and in whatever order they finished.

Executors: "local" (`jobs` processes; 1: in this process, one file after the other) and "dask" (the tasks go to
the Dask scheduler at `scheduler`, whose workers must see the files at the same paths: shared storage).
A single file is loaded and analysed in this process (its columns are the unit of work).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from stepscope.analysis.analyze import AnalysisResult, RankPart, analyze, analyze_rank_part, combine_ranks
from stepscope.analysis.findings.replayed import on_rank
from stepscope.analysis.options import AnalysisOptions, with_changes
from stepscope.analysis.per_rank.summary import SUMMARY_SCHEMA, RankSummary, Summary, summarize
from stepscope.analysis.per_rank.totals import RankTotals, rank_totals
from stepscope.analysis.read.heap import HEAP_TUNING_MIN_BYTES, keep_freed_memory
from stepscope.analysis.read.loader import (
    assign_ranks,
    estimated_json_bytes,
    find_traces,
    load_trace,
    skipping,
    split_merged,
)
from stepscope.analysis.read.source import Source, as_source
from stepscope.analysis.read.table import MISSING, RankInfo, TraceTable
from stepscope.analysis.tasks import (
    POOL_MIN_BYTES,
    ExecutorError,
    Failed,
    ProgressCallback,
    cpu_count,
    run_tasks,
)

__all__ = [
    "EXECUTORS",
    "ExecutorError",
    "PathAnalysis",
    "analyze_input",
    "analyze_path",
    "default_jobs",
]

EXECUTORS = ("local", "dask")


class Task(msgspec.Struct, frozen=True):
    """What every task needs to know besides its file (picklable: it travels to the workers)."""

    options: AnalysisOptions = msgspec.field(default_factory=AnalysisOptions)
    known_groups: dict[str, dict[str, Any]] | None = None  # the run folder's record of the process groups
    totals: bool = (
        False  # each rank's totals too (per_rank/totals.py: what a diff needs besides the analysis)
    )
    summary_top: int | None = None  # each rank's summary too, its `top` ops and kernels (what a report shows)
    critical_path: bool = True  # the job's critical path across ranks (combine_ranks)


class FileResult(msgspec.Struct):
    """What one task sends back: the file's ranks (a merged trace holds several) and its notices."""

    path: str
    hint: int | None
    parts: list[tuple[int | None, RankPart]] = msgspec.field(default_factory=list)  # (declared rank, part)
    extras: list[RankExtras] = msgspec.field(default_factory=list)  # one per part
    notices: list[str] = msgspec.field(default_factory=list)


class RankExtras(msgspec.Struct):
    """What a command needs of a rank besides its analysis, made where the rank is analysed."""

    info: RankInfo  # its file's record of itself (source, world size, devices; not its process groups)
    totals: RankTotals | None = None  # with Task.totals
    summary: RankSummary | None = None  # with Task.summary_top


class PathAnalysis(msgspec.Struct):
    """`analyze_input`'s answer: the analysis, each rank's extras by rank, and the notices of the input itself
    (its files, windows and ranks; the analysis' own notices are in `result`)."""

    result: AnalysisResult
    ranks: dict[int, RankExtras]
    notices: list[str]

    def summary(self, top: int) -> Summary:
        """The ranks' summaries as `summarize` gives them for the whole input."""
        ranks = [x.summary for _, x in sorted(self.ranks.items()) if x.summary is not None]
        return Summary(schema=SUMMARY_SCHEMA, top=top, ranks=ranks, notices=list(self.notices))


def default_jobs() -> int:
    """All the CPUs this process may run on."""
    return cpu_count()


def analyze_path(
    path: str | Path | Source,
    options: AnalysisOptions | None = None,
    *,
    progress: ProgressCallback | None = None,
    **changes: Any,
) -> AnalysisResult:
    """Analyse a trace file, a folder of per-rank traces or a run folder with `options` (or the defaults with
    `changes`: AnalysisOptions' fields).

    `step`: a run folder's window ending there. `jobs`: worker processes of the local executor (default: all
    CPUs; none below POOL_MIN_BYTES of JSON). `executor="dask"` sends the per-file tasks to the Dask scheduler
    at `scheduler` (None: a cluster of this machine's cores). `progress` is called with (bytes done, bytes in
    all, file at work). `steps`: (first, last) ProfilerStep numbers to analyse (see analyze). Raises InputError
    (a bad file, or no step in `steps`) or ExecutorError."""
    return _analyze_path(path, Task(with_changes(options, changes)), progress).result


def analyze_input(
    path: str | Path | Source,
    options: AnalysisOptions | None = None,
    *,
    progress: ProgressCallback | None = None,
    totals: bool = False,
    summary_top: int | None = None,
    critical_path: bool = True,
    **changes: Any,
) -> PathAnalysis:
    """`analyze_path` with what else a command needs of each rank, made where the rank is analysed (never the
    rows of every rank in one process): its file's record, its totals (`totals`: per_rank/totals.py, a diff's
    side) and its summary of `summary_top` ops and kernels (a report's). `critical_path=False`: without the
    job's critical path across ranks (a diff shows none)."""
    task = Task(
        with_changes(options, changes), totals=totals, summary_top=summary_top, critical_path=critical_path
    )
    return _analyze_path(path, task, progress)


def _analyze_path(path: str | Path | Source, task: Task, progress: ProgressCallback | None) -> PathAnalysis:
    options = task.options
    jobs, executor, step = options.jobs, options.executor, options.step
    if executor not in EXECUTORS:
        raise ValueError(f"executor must be one of {EXECUTORS}, not {executor!r}")
    source = as_source(path)
    files, window_notices = find_traces(source, step)
    known = _recorded_groups(source)
    task = msgspec.structs.replace(task, known_groups=known)
    if len(files) == 1 and executor == "local":
        workers = jobs if jobs is not None else default_jobs()
        table = load_trace(source, step=step, workers=workers, progress=progress, flows=False)
        extras = _extras(table, task)
        notices = list(table.notices)
        analysis = analyze(table, options, known_groups=known, critical_path=task.critical_path)
        return PathAnalysis(analysis, extras, notices)
    skipped = skipping(source)
    sizes = [estimated_json_bytes(f) for f, _ in files]
    if sum(sizes) >= HEAP_TUNING_MIN_BYTES:
        keep_freed_memory()  # (before the workers are forked: they inherit it)
    tasks = [(str(f), hint) for f, hint in files]
    if executor == "dask":
        results = _run_dask(tasks, sizes, task, options.scheduler, progress)
    else:
        workers = jobs if jobs is not None else default_jobs() if sum(sizes) >= POOL_MIN_BYTES else 1
        results = _run(tasks, sizes, task, workers, progress)
    kept = []
    for result in results:  # (in the tasks' order)
        if isinstance(result, Failed):
            skipped.skip_or_raise(result.error())
        else:
            kept.append(result)
    if not kept:
        raise skipped.nothing_left(source.path)
    return _combine(kept, [*window_notices, *skipped.notices], task.critical_path)


def _recorded_groups(source: Source) -> dict[str, dict[str, Any]] | None:
    """A run folder's record of the job's process groups (None for a file or a folder of traces, whose analysis
    then imports none of the run folder's modules)."""
    if not source.is_run_folder:
        return None
    from stepscope.analysis.run.folder import recorded_groups

    return recorded_groups(source)


# --- one task ----------------------------------------------------------------------------------------
def analyze_file(path: str, hint: int | None, task: Task) -> FileResult:
    """Load one file and analyse each of its ranks on its own (the task every executor runs). Raises
    InputError for a file that cannot be read or has no step in --steps (the task runner sends it back)."""
    from stepscope.analysis.read.loader import load_file

    file_table = load_file(path, hint, flows=False)
    result = FileResult(path, hint, notices=list(file_table.notices))
    _analyze_pieces(file_table, task, result)
    return result


def _analyze_pieces(file_table: Any, task: Task, result: FileResult) -> None:
    """Each rank of a loaded file (a merged trace holds several) analysed on its own, into `result`."""
    from stepscope.analysis.read.loader import merge_tables

    for piece in split_merged([file_table]):
        declared = piece.declared_rank
        piece.notices = []
        table = merge_tables(
            [piece]
        )  # one rank: its declared rank, else 0 until the parent numbers the files
        rank = table.rank_ids()[0]
        result.extras.append(_extras(table, task)[rank])
        part = analyze_rank_part(table, rank, task.options, known_groups=task.known_groups)
        # (the what-if graph is two thirds of what a part sends back; only the job's critical path reads it)
        if not task.critical_path:
            part.graph = None
        result.parts.append((declared, part))


def _extras(table: TraceTable, task: Task) -> dict[int, RankExtras]:
    """Each rank's extras (the table's derived values dropped after them: the analysis makes its own)."""
    totals = rank_totals(table) if task.totals else {}
    summaries = {}
    if task.summary_top is not None:
        summaries = {s.rank: s for s in summarize(table, top=task.summary_top).ranks}
    if task.totals or task.summary_top is not None:
        table.derived.clear()
    out = {}
    for rank in table.rank_ids():
        info = table.ranks.get(rank) or RankInfo(rank=rank, source="")
        # (a group's ranks, a merged trace's header: what could be large, and no command reads here)
        info = msgspec.structs.replace(info, process_groups=[], merge_header=None)
        out[rank] = RankExtras(info, totals.get(rank), summaries.get(rank))
    return out


# --- numbering and combining ---------------------------------------------------------------------------
class _Entry(msgspec.Struct):
    """A rank of a file, as the loader's rank assignment sees a FileTable."""

    path: str
    declared_rank: int | None
    info: RankInfo
    part: RankPart
    extras: RankExtras


def _combine(results: list[FileResult], notices: list[str], critical_path: bool) -> PathAnalysis:
    entries = []
    for result in results:
        for i, (declared, part) in enumerate(result.parts):
            info = RankInfo(rank=MISSING, source=part.analysis.source)
            entries.append(_Entry(result.path, declared, info, part, result.extras[i]))
    rank_notices = assign_ranks(entries)  # type: ignore[arg-type]
    for entry in entries:
        _renumber(entry.part, entry.info.rank)
        entry.extras.info.rank = entry.info.rank
        if entry.extras.summary is not None:
            entry.extras.summary.rank = entry.info.rank
    first_rank: dict[str, int] = {}
    for entry in entries:
        first_rank[entry.path] = min(entry.info.rank, first_rank.get(entry.path, entry.info.rank))
    file_notices = [n for r in sorted(results, key=lambda r: first_rank.get(r.path, 0)) for n in r.notices]
    entries.sort(key=lambda e: e.info.rank)
    input_notices = [*notices, *rank_notices, *file_notices]
    return PathAnalysis(
        combine_ranks([e.part for e in entries], input_notices, critical_path=critical_path),
        {e.info.rank: e.extras for e in entries},
        input_notices,
    )


def _renumber(part: RankPart, rank: int) -> None:
    """Give a part the rank the parent chose for its file."""
    part.analysis.rank = rank
    for row in part.analysis.step_categories:
        row.rank = rank
    for finding in part.findings:
        if finding.rank is not None:
            finding.rank = rank
        if finding.whatif:
            given = on_rank(finding.whatif, rank)
            if (
                finding.saving_note
            ):  # (it names the selectors a replay removed, as `stepscope whatif` takes them)
                for old, new in zip(finding.whatif, given, strict=True):
                    finding.saving_note = finding.saving_note.replace(old, new)
            finding.whatif = given
    if part.analysis.replay_savings is not None:
        part.analysis.replay_savings.whatif = on_rank(part.analysis.replay_savings.whatif, rank)
    part.instances.rank = rank
    part.summary.rank = rank
    for view in (
        part.expert.stats if part.expert is not None else None,
        part.tensor,
        part.fsdp,
        part.pipeline,
    ):
        if view is not None:
            view.rank = rank
    if part.graph is not None:
        part.graph.rank = rank


# --- executors -----------------------------------------------------------------------------------------
def _run(
    tasks: list[tuple[str, int | None]],
    sizes: list[int],
    task: Task,
    jobs: int,
    progress: ProgressCallback | None,
    executor: Any = None,
) -> list[FileResult | Failed]:
    """Every file's task on the task runner (local processes, or the caller's executor), in the tasks' order."""
    results = run_tasks(
        analyze_file,
        [(path, hint, task) for path, hint in tasks],
        workers=jobs,
        weights=sizes,
        labels=[Path(path).name for path, _ in tasks],
        progress=progress,
        executor=executor,
    )
    done = dict(results)
    return [done[i] for i in range(len(tasks))]


def _run_dask(
    tasks: list[tuple[str, int | None]],
    sizes: list[int],
    task: Task,
    scheduler: str | None,
    progress: ProgressCallback | None,
) -> list[FileResult | Failed]:
    try:
        from distributed import Client
    except ImportError:
        raise ExecutorError(
            "the dask executor needs dask.distributed: pip install 'stepscope[dask]'"
        ) from None
    try:
        client = (
            Client(scheduler, timeout=10) if scheduler else Client(processes=True, dashboard_address=None)
        )
    except (OSError, TimeoutError) as exc:
        raise ExecutorError(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from None
    try:
        return _run(tasks, sizes, task, len(tasks), progress, client.get_executor(pure=False))
    finally:
        client.close()
