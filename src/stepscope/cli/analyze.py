"""`stepscope analyze PATH`: time breakdown, idle causes, overlap, stragglers and findings with advice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from stepscope.analysis.options import AnalysisOptions
from stepscope.cli._common import (
    analysis_options,
    check_patterns,
    console,
    print_json,
    print_notes,
    wide_option,
    with_progress,
)
from stepscope.cli._output import kept_json


@click.command(name="analyze")
@click.argument("path", type=click.Path(path_type=Path, readable=False))
@click.option(
    "--json", "as_json", is_flag=True, help='Print one JSON document (schema "stepscope.analysis/4").'
)
@analysis_options("analyze")
@wide_option
@kept_json("analyze")
def command(path: Path, as_json: bool, wide: bool, options: AnalysisOptions) -> None:
    """Analyze PATH (a trace file, a folder of per-rank traces, or a run folder).

    A run folder adds what the run measured outside its traces: step times over the whole run, FLOPs / MFU,
    memory and system samples."""
    from stepscope.analysis.read.loader import run_folders
    from stepscope.analysis.read.source import Source

    source = Source(path)  # (what PATH is, its manifest and config: read once for the whole command)
    runs = run_folders(source)
    if runs:
        _analyze_runs(path, runs, as_json, wide, options)
        return
    result = _analyze_one(source, options)
    if as_json:
        print_json(result)
        return
    _print(result, wide)


def _analyze_one(source: Any, options: AnalysisOptions) -> Any:
    """The AnalysisResult of one trace, folder of rank traces or run folder (with what the run measured);
    `source`: its analysis.read.source.Source."""
    from stepscope.analysis.service import analyze_source

    check_patterns(options.comm_patterns)
    return with_progress(analyze_source, source, options)


def _print(result: Any, wide: bool) -> None:
    from stepscope.report.terminal.analysis import AnalysisReport

    print_notes(result.notices)
    print_notes(f"rank {r.rank}: {note}" for r in result.ranks for note in r.notes)
    if result.run is not None:  # (a note the traces' loader gave too, such as a rebuilt manifest, once)
        print_notes(note for note in result.run.notes if note not in result.notices)
    console(wide).print(AnalysisReport(result, wide=wide))


RUNS_SCHEMA = "stepscope.analysis-runs/1"


def _analyze_runs(path: Path, runs: list[Path], as_json: bool, wide: bool, options: AnalysisOptions) -> None:
    """PATH holds runs in sub-folders (h100/, mi300/): each is analysed on its own, never mixed as ranks."""
    names = ", ".join(str(r.relative_to(path)) for r in runs)
    notice = (
        f"{path}: {len(runs)} {'run' if len(runs) == 1 else 'runs'} in sub-folders ({names}), analyzed "
        "separately (not as ranks of one job)"
    )
    from stepscope.analysis.read.source import Source

    results = [(run, _analyze_one(Source(run), options)) for run in runs]
    if as_json:
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
