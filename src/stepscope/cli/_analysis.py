"""The body of `stepscope analyze` (cli/analyze.py gives it its options), without click: `stepscope analyze PATH
--json`, the common form, runs it without importing click at all (see cli/__init__.py, `_analyze_json`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def run_analyze(
    path: Path,
    step: int | None,
    as_json: bool,
    drop_last_step: bool,
    step_range: tuple[int | None, int | None] | None,
    top: int,
    comm_patterns: tuple[str, ...],
    jobs: int | None,
    executor: str,
    scheduler: str | None,
    wide: bool,
) -> None:
    """Analyze PATH and print the result (see cli/analyze.py for the options)."""
    from stepscope.analysis.read.loader import run_folders

    with _collector_paused_for_a_file(path, executor):
        options: dict[str, Any] = {
            "step": step,
            "drop_last_step": drop_last_step,
            "top": top,
            "steps": step_range,
        }
        options |= {"jobs": jobs, "executor": executor, "scheduler": scheduler}
        runs = run_folders(path) if path.is_dir() else []  # (a file: none of the run folders' modules)
        if runs:
            _analyze_runs(path, runs, as_json, comm_patterns, wide, **options)
            return
        result = _analyze_one(path, comm_patterns, **options)
        if as_json:
            from stepscope.cli._common import print_json

            print_json(result)
            return
        _print(result, wide)


@contextlib.contextmanager
def _collector_paused_for_a_file(path: Path, executor: str) -> Iterator[None]:
    """One trace file: its imports, its load (which pauses the collector itself) and its analyses make few
    reference cycles, and the collector's passes over the modules' objects cost ~3% of a small trace's analyze.
    (Not for folders: pool workers forked from here would run rank after rank without it; nor with Dask, whose
    client's event loop makes cycles all along.)"""
    import gc

    enabled = gc.isenabled()
    if executor != "dask" and path.is_file():
        gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _analyze_one(path: Path, comm_patterns: tuple[str, ...], **options: Any) -> Any:
    """The AnalysisResult of one trace, folder of rank traces or run folder (with what the run measured)."""
    from stepscope.cli._common import analyze_traces
    from stepscope.cli._common import comm_patterns as resolve_patterns

    patterns = resolve_patterns(path, comm_patterns)
    if not path.is_dir():  # a run folder is a folder: a trace file needs none of the run folders' modules
        return analyze_traces(path, comm_patterns=patterns, **options)
    from stepscope.runfolder import is_run_folder

    if not is_run_folder(path):
        return analyze_traces(path, comm_patterns=patterns, **options)
    from stepscope.analysis.analyze import SCHEMA, AnalysisResult, attach_run
    from stepscope.analysis.run.folder import load_run, no_traces_note, run_facts

    run = load_run(path)
    if run.has_traces:
        result = analyze_traces(path, comm_patterns=patterns, **options)
    else:
        note = f"{path}: {no_traces_note(run)}"
        result = AnalysisResult(SCHEMA, [], None, None, [], [note])
    attach_run(result, run_facts(run))
    return result


def _print(result: Any, wide: bool) -> None:
    from stepscope.cli._common import console, print_notes
    from stepscope.report.terminal.analysis import AnalysisReport

    print_notes(result.notices)
    print_notes(f"rank {r.rank}: {note}" for r in result.ranks for note in r.notes)
    if result.run is not None:  # (a note the traces' loader gave too, such as a rebuilt manifest, once)
        print_notes(note for note in result.run.notes if note not in result.notices)
    console(wide).print(AnalysisReport(result, wide=wide))


RUNS_SCHEMA = "stepscope.analysis-runs/1"


def _analyze_runs(
    path: Path, runs: list[Path], as_json: bool, comm_patterns: tuple[str, ...], wide: bool, **options: Any
) -> None:
    """PATH holds runs in sub-folders (h100/, mi300/): each is analysed on its own, never mixed as ranks."""
    from stepscope.cli._common import console, print_notes

    names = ", ".join(str(r.relative_to(path)) for r in runs)
    notice = (
        f"{path}: {len(runs)} runs in sub-folders ({names}), analyzed separately (not as ranks of one job)"
    )
    results = [(run, _analyze_one(run, comm_patterns, **options)) for run in runs]
    if as_json:
        from stepscope.cli._common import print_json

        print_json(
            {
                "schema": RUNS_SCHEMA,
                "runs": [{"path": str(run), "analysis": result} for run, result in results],
                "notices": [notice],
            }
        )
        return
    print_notes([notice])
    for run, result in results:
        console(wide).rule(str(run))
        _print(result, wide)
