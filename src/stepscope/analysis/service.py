"""The analyses as the commands ask for them: one input (a `Source`: a trace, a folder of traces, a run folder)
and one `AnalysisOptions` in, one result out, whatever the input is. The CLI parses its flags, checks what the
user typed, calls one of these and prints; what a run folder adds (its config's communication patterns, what it
measured outside its traces) is added here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stepscope.analysis.analyze import SCHEMA, AnalysisResult, attach_run
from stepscope.analysis.options import AnalysisOptions, with_changes
from stepscope.analysis.parallel import analyze_path
from stepscope.analysis.read.source import Source, as_source
from stepscope.analysis.tasks import ProgressCallback


def analyze_source(
    source: str | Path | Source,
    options: AnalysisOptions | None = None,
    *,
    progress: ProgressCallback | None = None,
    **changes: Any,
) -> AnalysisResult:
    """`stepscope analyze`: the AnalysisResult of a trace, a folder of rank traces or a run folder, with what a
    run folder measured outside its traces (its `run` facts) and its config's communication patterns added to
    `options`' (or the defaults with `changes`)."""
    source = as_source(source)
    options = with_changes(options, changes)
    options = options.but(comm_patterns=source.comm_patterns(options.comm_patterns))
    if not source.is_run_folder:
        return analyze_path(source, options, progress=progress)
    from stepscope.analysis.run.folder import load_run, no_traces_note, run_facts

    run = load_run(source)
    if run.has_traces:
        result = analyze_path(source, options, progress=progress)
    else:
        result = AnalysisResult(SCHEMA, [], None, None, [], [f"{source.path}: {no_traces_note(run)}"])
    attach_run(result, run_facts(run))
    return result
