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

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepscope.analysis.analyze import AnalysisResult, RankPart, analyze, analyze_rank_part, combine_ranks
from stepscope.analysis.read.heap import HEAP_TUNING_MIN_BYTES, keep_freed_memory
from stepscope.analysis.read.loader import (
    ProgressCallback,
    _assign_ranks,
    _estimated_json_bytes,
    _find_traces,
    _skipping,
    _split_merged,
    load_trace,
)
from stepscope.analysis.read.table import MISSING, RankInfo
from stepscope.errors import InputError

__all__ = ["EXECUTORS", "ExecutorError", "analyze_path", "default_jobs"]

EXECUTORS = ("local", "dask")


class ExecutorError(Exception):
    """The executor could not run (Dask missing, scheduler unreachable, a worker lost for good)."""


@dataclass(frozen=True)
class Options:
    """What every task needs to know besides its file (picklable: it travels to the workers)."""

    drop_last_step: bool = False
    top: int = 10
    comm_patterns: tuple[str, ...] = ()
    steps: tuple[int | None, int | None] | None = None


@dataclass
class FileResult:
    """What one task sends back: the file's ranks (a merged trace holds several), its notices, or the problem
    that stopped it."""

    path: str
    hint: int | None
    parts: list[tuple[int | None, RankPart]] = field(default_factory=list)  # (declared rank, part)
    notices: list[str] = field(default_factory=list)
    problem: str | None = None


def default_jobs() -> int:
    """All the CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def analyze_path(
    path: str | Path,
    *,
    step: int | None = None,
    drop_last_step: bool = False,
    top: int = 10,
    comm_patterns: Sequence[str] = (),
    jobs: int | None = None,
    executor: str = "local",
    scheduler: str | None = None,
    progress: ProgressCallback | None = None,
    steps: tuple[int | None, int | None] | None = None,
) -> AnalysisResult:
    """Analyse a trace file, a folder of per-rank traces or a run folder (`step`: its window ending there).

    `jobs`: worker processes of the local executor (default: all CPUs). `executor="dask"` sends the per-file
    tasks to the Dask scheduler at `scheduler` (None: a cluster of this machine's cores). `progress` is called
    with (bytes done, bytes in all, file at work). `steps`: (first, last) ProfilerStep numbers to analyse (see
    analyze). Raises InputError (a bad file, or no step in `steps`) or ExecutorError."""
    if executor not in EXECUTORS:
        raise ValueError(f"executor must be one of {EXECUTORS}, not {executor!r}")
    options = Options(drop_last_step, top, tuple(comm_patterns), steps)
    files, window_notices = _find_traces(Path(path), step)
    if len(files) == 1 and executor == "local":
        workers = jobs if jobs is not None else default_jobs()
        table = load_trace(path, step=step, workers=workers, progress=progress, flows=False)
        return analyze(
            table, drop_last_step=drop_last_step, top=top, comm_patterns=comm_patterns, steps=steps
        )
    skipped = _skipping(path)
    sizes = [_estimated_json_bytes(f) for f, _ in files]
    if sum(sizes) >= HEAP_TUNING_MIN_BYTES:
        keep_freed_memory()  # (before the workers are forked: they inherit it)
    tasks = [(str(f), hint) for f, hint in files]
    if executor == "dask":
        results = _run_dask(tasks, sizes, options, scheduler, progress)
    else:
        results = _run_local(tasks, sizes, options, jobs if jobs is not None else default_jobs(), progress)
    by_path = {r.path: r for r in results}
    ordered = [by_path[p] for p, _ in tasks]
    for result in ordered:
        if result.problem is not None:
            skipped.skip_or_raise(InputError(result.path, result.problem))
    kept = [r for r in ordered if r.problem is None]
    if not kept:
        raise skipped.nothing_left(path)
    return _combine(kept, [*window_notices, *skipped.notices])


# --- one task ----------------------------------------------------------------------------------------
def analyze_file(path: str, hint: int | None, options: Options) -> FileResult:
    """Load one file and analyse each of its ranks on its own (the task every executor runs)."""
    from stepscope.analysis.read._stream import load_file

    try:
        file_table = load_file(path, hint, flows=False)
    except InputError as exc:
        return FileResult(path, hint, problem=exc.problem)
    result = FileResult(path, hint, notices=list(file_table.notices))
    try:
        _analyze_pieces(file_table, options, result)
    except InputError as exc:  # (no step in --steps)
        return FileResult(path, hint, problem=exc.problem)
    return result


def _analyze_pieces(file_table: Any, options: Options, result: FileResult) -> None:
    """Each rank of a loaded file (a merged trace holds several) analysed on its own, into `result`."""
    from stepscope.analysis.read.loader import _merge

    for piece in _split_merged([file_table]):
        declared = piece.declared_rank
        piece.notices = []
        table = _merge([piece])  # one rank: its declared rank, else 0 until the parent numbers the files
        rank = table.rank_ids()[0]
        part = analyze_rank_part(
            table,
            rank,
            drop_last_step=options.drop_last_step,
            top=options.top,
            comm_patterns=options.comm_patterns,
            steps=options.steps,
        )
        result.parts.append((declared, part))


# --- numbering and combining ---------------------------------------------------------------------------
@dataclass
class _Entry:
    """A rank of a file, as the loader's rank assignment sees a FileTable."""

    path: str
    declared_rank: int | None
    info: RankInfo
    part: RankPart


def _combine(results: list[FileResult], notices: list[str]) -> AnalysisResult:
    entries = []
    for result in results:
        for declared, part in result.parts:
            info = RankInfo(rank=MISSING, source=part.analysis.source)
            entries.append(_Entry(result.path, declared, info, part))
    rank_notices = _assign_ranks(entries)  # type: ignore[arg-type]
    for entry in entries:
        _renumber(entry.part, entry.info.rank)
    file_notices = [n for r in sorted(results, key=lambda r: _first_rank(r, entries)) for n in r.notices]
    parts = [e.part for e in sorted(entries, key=lambda e: e.info.rank)]
    return combine_ranks(parts, [*notices, *rank_notices, *file_notices])


def _first_rank(result: FileResult, entries: list[_Entry]) -> int:
    return min((e.info.rank for e in entries if e.path == result.path), default=0)


def _renumber(part: RankPart, rank: int) -> None:
    """Give a part the rank the parent chose for its file."""
    part.analysis.rank = rank
    for row in part.analysis.step_categories:
        row.rank = rank
    for finding in part.findings:
        if finding.rank is not None:
            finding.rank = rank
    part.instances.rank = rank
    part.summary.rank = rank


# --- executors -----------------------------------------------------------------------------------------
def _run_local(
    tasks: list[tuple[str, int | None]],
    sizes: list[int],
    options: Options,
    jobs: int,
    progress: ProgressCallback | None,
) -> list[FileResult]:
    jobs = max(1, min(jobs, len(tasks)))
    if jobs > 1:
        results = _run_pool(tasks, sizes, options, jobs, progress)
        if results is not None:
            return results
    out = []
    done = 0
    total = max(sum(sizes), 1)
    for (path, hint), size in zip(tasks, sizes, strict=True):
        if progress is not None:
            progress(done, total, Path(path).name)
        out.append(analyze_file(path, hint, options))
        done += size
    if progress is not None:
        progress(total, total, "")
    return out


def _run_pool(
    tasks: list[tuple[str, int | None]],
    sizes: list[int],
    options: Options,
    jobs: int,
    progress: ProgressCallback | None,
) -> list[FileResult] | None:
    """The tasks on `jobs` processes, largest files first, in batches (see `_batches`): forked children where
    fork is safe (`_forked`), else a spawned ProcessPoolExecutor. When the forked pool fails (no process to be
    had, a worker killed), the batches it did not bring back run in this process. None when no spawned pool can
    run (the caller then runs every task here)."""
    from stepscope.analysis.ranks import _forked

    order = sorted(range(len(tasks)), key=lambda i: -sizes[i])
    batches = _batches(order, jobs)
    batch_sizes = [sum(sizes[i] for i in b) for b in batches]
    labels = [tasks[b[-1]] for b in batches]
    report = _Progress(batch_sizes, labels, progress)
    if not _forked.available():
        return _run_spawned(tasks, batches, options, jobs, report)
    try:
        done = _forked.run_forked(
            lambda i: analyze_file(*tasks[i], options), batches, jobs, lambda k, _: report(k)
        )
    except _forked.PoolFailed as failed:
        done = []
        for k, batch in enumerate(batches):
            if k in failed.done:
                done.append(failed.done[k])
            else:
                done.append(_analyze_batch([tasks[i] for i in batch], options))
                report(k)
    return [r for batch in done for r in batch]


def _run_spawned(
    tasks: list[tuple[str, int | None]],
    batches: list[list[int]],
    options: Options,
    jobs: int,
    report: _Progress,
) -> list[FileResult] | None:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    try:
        pool = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"))
        futures = {
            pool.submit(_analyze_batch, [tasks[i] for i in b], options): k for k, b in enumerate(batches)
        }
    except (OSError, RuntimeError):
        return None
    results = []
    finished = False
    try:
        for future in as_completed(futures):
            results.extend(future.result())
            report(futures[future])
        finished = True
    except BrokenProcessPool:  # (an error of the work itself is raised, as it would be in this process)
        return None
    finally:  # on an error, without running the batches still queued
        pool.shutdown(wait=finished, cancel_futures=not finished)
    return results


class _Progress:
    """Reports bytes done to a progress callback as the units of work (tasks, or batches of them) finish, in
    whatever order: `sizes[k]` bytes each, named by the file of `tasks[k]`."""

    def __init__(
        self, sizes: list[int], tasks: list[tuple[str, int | None]], progress: ProgressCallback | None
    ) -> None:
        self.sizes, self.tasks, self.progress = sizes, tasks, progress
        self.total = max(sum(sizes), 1)
        self.done = 0

    def __call__(self, k: int) -> None:
        self.done += self.sizes[k]
        if self.progress is not None:
            self.progress(self.done, self.total, Path(self.tasks[k][0]).name)


def _batches(order: list[int], jobs: int) -> list[list[int]]:
    """The tasks in `order` cut into the calls a worker takes one at a time: half of each worker's share of the
    tasks left (guided scheduling), so large batches first and single tasks at the end. A call's round trip
    (its results pickled, piped and read back while both CPUs are busy) costs about half a millisecond a task
    when tasks go one by one: 64 ranks on 2 workers run 1.5-3% faster in 15 calls than in 64, and the workers
    still end together."""
    out = []
    at = 0
    while at < len(order):
        size = max(1, (len(order) - at) // (2 * jobs))
        out.append(order[at : at + size])
        at += size
    return out


def _analyze_batch(tasks: list[tuple[str, int | None]], options: Options) -> list[FileResult]:
    return [analyze_file(path, hint, options) for path, hint in tasks]


def _run_dask(
    tasks: list[tuple[str, int | None]],
    sizes: list[int],
    options: Options,
    scheduler: str | None,
    progress: ProgressCallback | None,
) -> list[FileResult]:
    try:
        from distributed import Client, as_completed
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
        return _gather_dask(client, as_completed, tasks, sizes, options, progress)
    finally:
        client.close()


def _gather_dask(
    client: Any,
    as_completed: Callable[..., Any],
    tasks: list[tuple[str, int | None]],
    sizes: list[int],
    options: Options,
    progress: ProgressCallback | None,
) -> list[FileResult]:
    order = sorted(range(len(tasks)), key=lambda i: -sizes[i])
    futures = {
        client.submit(
            analyze_file, *tasks[i], options, key=f"stepscope-{i}-{Path(tasks[i][0]).name}", pure=False
        ): i
        for i in order
    }
    report = _Progress(sizes, tasks, progress)
    results = []
    try:
        for future in as_completed(list(futures)):
            i = futures[future]
            try:
                results.append(future.result())
            except Exception as exc:  # KilledWorker, a lost connection: the task could not be run
                raise ExecutorError(
                    f"{tasks[i][0]}: the Dask task failed ({type(exc).__name__}: {exc})"
                ) from None
            report(i)
    finally:
        for future in futures:
            future.cancel()
    return results
