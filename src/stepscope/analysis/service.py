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
    facts = run_facts(run)
    attach_anomalies(source, run, facts, options, result)
    attach_run(result, facts)
    return result


def attach_anomalies(
    source: Source, run: Any, facts: Any, options: AnalysisOptions, result: AnalysisResult
) -> None:
    """A watching run's windows compared with a plain one (`facts.anomalies`: attach_run makes a finding of each,
    first among `result`'s); nothing when the run's watch opened none, or `options.step` picks one window."""
    if not run.watch or not run.has_traces or options.step is not None:
        return
    facts.anomalies = anomaly_windows(source, run, facts, options, result)


# the newest windows of the watch compared with a plain window, at most (each is an analysis of the run's traces)
MAX_ANOMALY_WINDOWS = 4


def anomaly_windows(
    source: Source, run: Any, facts: Any, options: AnalysisOptions, latest: AnalysisResult
) -> list[Any]:
    """The newest windows the run's watch opened (MAX_ANOMALY_WINDOWS at most), each compared with a plain window
    of the run (analysis/run/anomaly.py); `latest`: the analysis of each rank's latest window, reused where it
    is one of them."""
    from stepscope.analysis.run.anomaly import compare, fallback_reference, watch_windows
    from stepscope.runfolder import ArtifactKind

    traced = {a.step for a in run.manifest.of_kind(ArtifactKind.TRACE) if a.step is not None}
    windows, reference = watch_windows(run.watch, traced)
    if not windows:
        return []
    if reference is None:
        spans = [tuple(w) for times in facts.step_times[:1] for w in times.windows if w[1] in traced]
        reference = fallback_reference(windows, spans)
    analysed: dict[int, AnalysisResult] = {}

    def at(step: int) -> AnalysisResult:
        if step not in analysed:
            ends = {r.steps[-1].step for r in latest.ranks if r.steps}
            same = ends == {step}
            analysed[step] = latest if same else analyze_path(source, options.but(step=step))
        return analysed[step]

    def ranks(w: Any) -> list[Any]:
        """Each rank's analysis of the window: the asker's steps, or later ones where a rank read it late."""
        found = {r.rank: r for r in at(w.last).ranks}
        for last in w.also:
            for r in at(last).ranks:
                if r.steps and r.steps[-1].step == last:
                    found.setdefault(r.rank, r)
        return [found[rank] for rank in sorted(found)]

    base = at(reference[1]).ranks if reference is not None else None
    return [compare(w, ranks(w), base, reference) for w in windows[-MAX_ANOMALY_WINDOWS:]]
