"""Load Kineto chrome traces into one `TraceTable` (no torch, no pandas).

`load_trace(path)` takes a trace file (.json or .json.gz, gzip recognised by its magic bytes), a folder of
per-rank traces, or a stepscope run folder (traces found through its manifest). Files are decoded one by
one (`_stream.load_file`), or by a process pool when several big files are given, then their symbol
tables are merged and every file gets a distinct rank.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stepscope.analysis.read._split import load_file_split
from stepscope.analysis.read._stream import FileTable, load_file
from stepscope.analysis.read.cache.tables import cached_load
from stepscope.analysis.read.combine import assign_ranks, merge_tables, split_merged
from stepscope.analysis.read.heap import HEAP_TUNING_MIN_BYTES, keep_freed_memory
from stepscope.analysis.read.source import Source, as_source
from stepscope.analysis.read.table import (
    TraceTable,
)
from stepscope.analysis.tasks import Failed, ProgressCallback, cpu_count, run_tasks
from stepscope.errors import InputError

__all__ = [
    "FileProgress",
    "Skipped",
    "assign_ranks",
    "estimated_json_bytes",
    "find_traces",
    "load_file",
    "load_trace",
    "merge_tables",
    "run_folders",
    "skipping",
    "split_merged",
    "trace_files",
]

TRACE_SUFFIXES = (".json", ".json.gz")
# Use worker processes when at least this many bytes of JSON (estimated) are spread over several files.
POOL_MIN_BYTES = 48 << 20
MIN_IDLE_CPUS = 1.5  # idle CPUs (count minus the 1-minute load average) a pool needs to be worth it


# --- finding the files -------------------------------------------------------------------------------
def trace_files(path: str | Path, *, step: int | None = None) -> list[tuple[Path, int | None]]:
    """The trace files behind PATH, each with the rank a run-folder manifest gives it (else None).

    A run folder holds one trace per rank per profiled window: `step` picks the window ending at that step,
    by default each rank's latest.
    """
    return find_traces(Path(path), step)[0]


def find_traces(
    path: str | Path | Source, step: int | None
) -> tuple[list[tuple[Path, int | None]], list[str]]:
    """The trace files of PATH, each with its rank where the run folder's manifest gives one, and notices."""
    source = as_source(path)
    try:
        return _list_traces(source, step)
    except PermissionError as exc:  # a folder without search or read permission, on the way or at the end
        raise InputError(exc.filename or source.path, f"cannot read: {exc.strerror or exc}") from None


def _why_missing(path: Path) -> str:
    """Why a path that does not exist cannot be read: a symbolic link to nothing (or to itself, by a loop) says
    so, where the plain 'no such file' would send the user looking for a file they can see."""
    if not path.is_symlink():
        return "no such file or directory"
    try:
        path.resolve(strict=True)
    except RuntimeError:
        return "a loop of symbolic links"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a loop of symbolic links"
    return f"a symbolic link to {os.readlink(path)!r}, which does not exist"


def _list_traces(source: Source, step: int | None) -> tuple[list[tuple[Path, int | None]], list[str]]:
    p = source.path
    if not p.exists():
        raise InputError(p, _why_missing(p))
    if p.is_file():
        return [(p, None)], []
    if not p.is_dir():
        raise InputError(p, "not a regular file or directory")
    if source.is_run_folder:
        return _run_folder_window(source, step)
    # Hidden files are skipped: writers' temp files (a killed export leaves `.rank0_step6.json.gz.*`) are hidden.
    files, notices = _once_each(
        sorted(
            f
            for f in p.iterdir()
            if f.is_file() and f.name.endswith(TRACE_SUFFIXES) and not f.name.startswith(".")
        )
    )
    if not files:
        runs = run_folders(p)
        if runs:
            listed = ", ".join(str(r.relative_to(p)) for r in runs[:8]) + (", ..." if len(runs) > 8 else "")
            raise InputError(p, f"holds {len(runs)} runs in sub-folders ({listed}): give one of them")
        raise InputError(p, "directory has no trace files (*.json, *.json.gz)")
    return [(f, None) for f in files], notices


def _once_each(files: list[Path]) -> tuple[list[Path], list[str]]:
    """`files` without the second and later names (links) of a file already listed, with a notice for each:
    one trace is one rank."""
    first: dict[str, Path] = {}
    notices = []
    for f in files:
        real = os.path.realpath(f)
        if real in first:
            notices.append(f"{f}: the same file as {first[real]}; read once")
        else:
            first[real] = f
    return list(first.values()), notices


MAX_RUN_DEPTH = 3  # sub-folder levels searched for runs


def run_folders(path: str | Path | Source) -> list[Path]:
    """The runs below a folder that holds no trace of its own: sub-folders (up to MAX_RUN_DEPTH levels down)
    that are run folders or hold trace files, each taken whole (its own sub-folders are its business).
    Empty for a run folder, a folder with traces of its own, or a file."""
    source = as_source(path)
    p = source.path
    if not p.is_dir() or source.is_run_folder or _holds_traces(p):
        return []
    from stepscope.runfolder import is_run_folder

    found: list[Path] = []
    # Folders are walked once each, by real path: a link back up (`x -> .`) or a second link to a folder already
    # seen is passed over (20 self-links once made 421 runs of one, and a minute of walking).
    walked = {os.path.realpath(p)}

    def walk(folder: Path, depth: int) -> None:
        try:
            subs = sorted(d for d in folder.iterdir() if d.is_dir() and not d.name.startswith("."))
        except OSError:
            return
        for sub in subs:
            real = os.path.realpath(sub)
            if real in walked:
                continue
            walked.add(real)
            if is_run_folder(sub) or _holds_traces(sub):
                found.append(sub)
            elif depth < MAX_RUN_DEPTH:
                walk(sub, depth + 1)

    walk(p, 1)
    return found


def _holds_traces(folder: Path) -> bool:
    try:
        return any(
            f.name.endswith(TRACE_SUFFIXES) and not f.name.startswith(".") and f.is_file()
            for f in folder.iterdir()
        )
    except OSError:
        return False


def _run_folder_window(source: Source, step: int | None) -> tuple[list[tuple[Path, int | None]], list[str]]:
    """One trace per rank from a run folder: the window ending at `step`, or each rank's latest."""
    from stepscope.runfolder.manifest import LEFT_OUT

    p = source.path
    manifest, notices = source.manifest()  # a damaged manifest: the folder read by its layout, with a notice
    traces = [a for a in manifest.artifacts if a.kind == "trace"]
    if not traces:
        left_out = next((n for n in notices if LEFT_OUT in n), None)
        if (
            left_out is not None
        ):  # (the one-line error says why: every trace it indexed lies out of the folder)
            raise InputError(p, f"run folder has no trace to read ({left_out})")
        raise InputError(p, "run folder has no trace artifacts in its manifest")
    windows = sorted({a.step for a in traces if a.step is not None})
    by_rank: dict[int | None, list[Any]] = {}
    for artifact in traces:
        by_rank.setdefault(artifact.rank, []).append(artifact)
    if step is not None and step not in windows:
        listed = ", ".join(map(str, windows)) or "none"
        raise InputError(p, f"no trace of a window ending at step {step} (windows end at steps: {listed})")
    chosen = []
    missing: list[Path] = []
    for rank, artifacts in by_rank.items():
        candidates = [a for a in artifacts if step is None or a.step == step]
        candidates.sort(key=lambda a: -1 if a.step is None else a.step, reverse=True)
        present = [a for a in candidates if (p / a.path).is_file()]
        gone = [p / a.path for a in candidates[: candidates.index(present[0])]] if present else []
        if present:
            chosen.append((p / present[0].path, rank))
            for file in gone:  # its latest window's file was deleted: the one before it is read instead
                notices.append(
                    f"{file}: listed in the run folder's manifest but missing; rank {rank} is read from the "
                    f"window ending at step {present[0].step}"
                )
        elif candidates:
            missing.append(p / candidates[0].path)
            notices.append(
                f"{p / candidates[0].path}: listed in the run folder's manifest but missing; "
                f"rank {rank} is left out"
            )
    if not chosen:
        raise InputError(missing[0], "listed in the run folder's manifest but missing")
    if len(windows) > 1:
        which = f"step {step}" if step is not None else "each rank's latest"
        notices.append(
            f"{p}: windows end at steps {', '.join(map(str, windows))}; analyzing {which} (choose with --step)"
        )
    return sorted(chosen, key=lambda item: str(item[0])), notices


# --- several files: ranks, pool, merge ----------------------------------------------------------------


def load_trace(
    path: str | Path | Source,
    *,
    step: int | None = None,
    workers: int | None = None,
    progress: ProgressCallback | None = None,
    flows: bool = True,
) -> TraceTable:
    """Load a trace file, a folder of per-rank traces or a run folder into one TraceTable.

    `step`: for a run folder, the window ending at that step (default: each rank's latest window).
    Ranks come from each file's `distributedInfo.rank` (or the run folder's manifest); files without one,
    or repeating a rank already taken, get the lowest free ranks in path order and a notice in `notices`.
    `workers`: processes for multi-file loads (None: decide from the amount of data; 1: no pool). One big
    plain-JSON file is read by `workers` processes side by side when `workers` is given (see _split).
    `progress`: called as loading proceeds with (bytes done, bytes in all, name of the file at work); the CLI
    draws its progress bar from it. `flows`: keep flow events ('s' / 'f' rows: arrows for a viewer, which
    no analysis reads; leaving them out saves about a third of the rows of a GPU trace).
    Raises InputError naming the file and the problem.
    """
    source = as_source(path)
    files, window_notices = find_traces(source, step)
    # In a plain folder, JSON files that are not chrome traces (an execution trace, a config) are skipped.
    skipped = skipping(source)
    sizes = [estimated_json_bytes(f) for f, _ in files]
    if sum(sizes) >= HEAP_TUNING_MIN_BYTES:
        keep_freed_memory()
    n_workers = _choose_workers(workers, sizes)
    tables = _load_in_pool(files, sizes, n_workers, progress, skipped, flows) if n_workers > 1 else None
    if tables is None and len(files) == 1 and workers is not None and workers > 1:
        (file, hint), bar = files[0], FileProgress(sizes[0], progress)
        try:
            reporter = bar.reporter(file.name, 0, sizes[0])
            tables = [
                cached_load(
                    file, hint, flows, lambda: load_file_split(file, hint, workers, reporter, flows=flows)
                )
            ]
        except InputError as exc:
            skipped.skip_or_raise(exc)
            tables = []
    if tables is None:
        skipped.notices.clear()
        bar = FileProgress(sum(sizes), progress)
        tables = []
        done = 0
        for (file, hint), size in zip(files, sizes, strict=True):
            try:
                reporter = bar.reporter(file.name, done, size)
                tables.append(
                    cached_load(file, hint, flows, lambda: load_file(file, hint, reporter, flows=flows))  # noqa: B023
                )
            except InputError as exc:
                skipped.skip_or_raise(exc)
            done += size
        bar.update(done, "")
    if not tables:
        raise skipped.nothing_left(source.path)
    table = merge_tables(tables)
    table.notices[:0] = window_notices + skipped.notices
    return table


class Skipped:
    """Files that are left out with a notice instead of an error: in a plain folder, JSON files that are not
    chrome traces; in a run folder, a rank's trace that cannot be read (a damaged artifact never stops the
    reading of the others). `first` keeps the first such error: raised when no file is left."""

    def __init__(self, enabled: bool, run_folder: bool = False) -> None:
        self.enabled = enabled
        self.run_folder = run_folder
        self.notices: list[str] = []
        self.first: InputError | None = None

    def skip_or_raise(self, error: InputError) -> None:
        if self.run_folder:
            self.first = self.first or error
            self.notices.append(
                f"{error.path}: {error.problem}; this rank is left out, the others are analyzed"
            )
            return
        if not (self.enabled and "not a chrome trace" in error.problem):
            raise error
        self.notices.append(f"{error.path}: skipped, {error.problem}")

    def nothing_left(self, path: str | Path) -> InputError:
        return self.first or InputError(path, "directory has no chrome traces (JSON with traceEvents)")


def skipping(path: str | Path | Source) -> Skipped:
    source = as_source(path)
    if not source.path.is_dir():  # one file (and no run-folder modules to import for it)
        return Skipped(False)
    run_folder = source.is_run_folder
    return Skipped(not run_folder, run_folder)


def estimated_json_bytes(path: Path) -> int:
    """Size of the JSON: a gzip file's last 4 bytes hold it (modulo 4 GiB)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            if fh.read(2) != b"\x1f\x8b" or size < 18:
                return size
            fh.seek(-4, os.SEEK_END)
            isize = int.from_bytes(fh.read(4), "little")
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
    return max(isize, size)


def _choose_workers(workers: int | None, sizes: list[int]) -> int:
    """A pool pays for itself only with several big files and idle CPUs to decode them on: on a busy
    machine a second process just takes turns with the first (measured in docs/benchmarks.md)."""
    if workers is not None:
        return max(1, min(workers, len(sizes)))
    if len(sizes) < 2 or sum(sizes) < POOL_MIN_BYTES:
        return 1
    cpus = cpu_count()
    idle = cpus - os.getloadavg()[0] if hasattr(os, "getloadavg") else cpus - 1
    if idle < MIN_IDLE_CPUS:
        return 1
    return max(2, min(len(sizes), int(idle), 8))


def _load(path: Path, hint: int | None, flows: bool) -> FileTable:
    """Task: one file's table (its InputError comes back from the task runner as a Failed)."""
    return cached_load(path, hint, flows, lambda: load_file(path, hint, flows=flows))


def _load_in_pool(
    files: list[tuple[Path, int | None]],
    sizes: list[int],
    n_workers: int,
    progress: ProgressCallback | None,
    skipped: Skipped,
    flows: bool,
) -> list[FileTable]:
    """Decode the files on the task runner's processes (in this process when none can run)."""
    results: dict[int, FileTable | None] = {}
    done = run_tasks(
        _load,
        [(f, hint, flows) for f, hint in files],
        workers=n_workers,
        weights=sizes,
        labels=[f.name for f, _ in files],
        progress=progress,
    )
    for i, result in done:
        if isinstance(result, Failed):
            skipped.skip_or_raise(result.error())  # (an error that is raised stops the tasks not started)
            results[i] = None
        else:
            results[i] = result
    return [t for t in (results[i] for i in range(len(files))) if t is not None]


class FileProgress:
    """Turns per-file progress into (done, total, label) calls of the caller's callback (if any)."""

    def __init__(self, total_bytes: int, callback: ProgressCallback | None) -> None:
        self.total = max(total_bytes, 1)
        self.callback = callback

    def update(self, completed: int, label: str) -> None:
        """`completed` bytes of the total are loaded; `label` names the file at work."""
        if self.callback is not None:
            self.callback(min(completed, self.total), self.total, label)

    def reporter(self, label: str, before: int, size: int) -> Callable[[float], None] | None:
        """A callback for one file's phases: fraction of that file done."""
        if self.callback is None:
            return None
        return lambda fraction: self.update(before + int(fraction * size), label)
