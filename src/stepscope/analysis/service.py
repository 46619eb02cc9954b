"""The analyses as the commands ask for them: one input (a `Source`: a trace, a folder of traces, a run folder)
and one `AnalysisOptions` in, one result out, whatever the input is. The CLI parses its flags, checks what the
user typed, calls one of these and prints; what a run folder adds (its config's communication patterns, what it
measured outside its traces) is added here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from stepscope.analysis.analyze import SCHEMA, AnalysisResult, attach_run
from stepscope.analysis.options import AnalysisOptions, with_changes
from stepscope.analysis.parallel import analyze_path
from stepscope.analysis.read.source import Source, as_source
from stepscope.analysis.tasks import ProgressCallback
from stepscope.errors import InputError

if TYPE_CHECKING:
    from stepscope.analysis.ops import OpsResult


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


def ops_analysis(
    source: str | Path | Source,
    options: AnalysisOptions | None = None,
    *,
    progress: ProgressCallback | None = None,
) -> OpsResult:
    """`stepscope ops`: every rank's ops against its roofline (analysis/ops), each finding then priced in step
    time by a replay of its rank's steps with the op's work made that much faster (findings/replayed.op_savings):
    a kernel off the critical path saves less than its own time."""
    from stepscope.analysis.ops import ops_source

    source = as_source(source)
    options = options or AnalysisOptions()
    result = ops_source(source, options, progress)
    if any(r.findings for r in result.ranks):
        _price_ops(source, options, result)
    return result


def _price_ops(source: Source, options: AnalysisOptions, result: OpsResult) -> None:
    from stepscope.analysis.findings.replayed import OpChange, op_savings
    from stepscope.analysis.ops.roofline import WHOLE_TRACE
    from stepscope.analysis.per_rank.prepare import prepare_rank
    from stepscope.analysis.read.loader import load_trace

    try:
        table = load_trace(source, step=options.step)
    except InputError as exc:  # (the table's reader is stricter than the op model's: the op times stand)
        for ops in result.ranks:
            for f in ops.findings:
                f.replay_note = f"not replayed: {exc}"
        return
    by_file = {str(Path(info.source)): rank for rank, info in table.ranks.items()}
    for ops in result.ranks:
        rank = by_file.get(str(Path(ops.path)))
        if not ops.findings or rank is None:
            continue
        per_op: dict[str, float] = {}
        for g in ops.groups:
            per_op[g.name] = per_op.get(g.name, 0.0) + g.time_us
        # (a finding names one op's calls of some shapes; every call of the op is scaled by one factor that
        # frees as much of its time: the replay cannot tell the calls' shapes apart)
        changes = [OpChange(f.name, max(0.0, 1.0 - f.saving_us / per_op[f.name])) for f in ops.findings]
        priced = op_savings(prepare_rank(table, rank), changes)
        for i, f in enumerate(ops.findings):
            if priced is None:
                f.replay_note = "not replayed: the rank's trace has no steps to replay"
            elif priced.approximate is not None:
                f.replay_note = f"not replayed: {priced.approximate}, so it prices no change"
            else:
                f.step_saving_us = 1e3 * priced.saving_ms[i]
                error = (
                    ""
                    if priced.error_pct is None
                    else f" (the replay is within {abs(priced.error_pct):.1f}% of the measured step)"
                )
                step = f"{priced.replayed_step_ms:.3g} ms" + (
                    " with the device work launched in it" if ops.time_kind == "device" else ""
                )
                # (a trace that marks no ProfilerStep is replayed as one step: the whole trace)
                of_what = "of its median step" if ops.steps else f"of {WHOLE_TRACE}"
                f.replay_note = (
                    f"a replay of the rank's steps with {f.name}'s work at {changes[i].factor:.2f} of its time "
                    f"saves {priced.saving_ms[i]:.3g} ms {of_what}, {step}{error}"
                )
        # (ranked by what they save of the step, as analyze ranks its findings; the op time where not replayed)
        ops.findings.sort(key=lambda f: -(f.step_saving_us if f.step_saving_us is not None else f.saving_us))
    table.derived.clear()
