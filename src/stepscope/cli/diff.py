"""`stepscope diff BASE TEST`: what changed between two runs or traces, with CI gates (`--fail-on`)."""

from __future__ import annotations

import click

from stepscope.analysis.options import AnalysisOptions
from stepscope.cli._common import analysis_options, print_json, wide_option
from stepscope.cli._output import kept_json
from stepscope.units import plain

EXIT_GATE_BREACHED = 3
EXIT_GATE_UNDECIDED = 4  # no gate breached, but the data could not decide one of them


@click.command(name="diff")
@click.argument("base", type=click.Path(path_type=str, readable=False))
@click.argument("test", type=click.Path(path_type=str, readable=False))
@click.option("--top", type=int, default=10, show_default=True, help="Rows per table.")
@click.option(
    "--factor",
    type=float,
    default=5.0,
    show_default=True,
    help="Flag kernels and ops whose mean duration changed by this factor or more (and by the listing threshold).",
)
@click.option(
    "--fail-on",
    "fail_on",
    multiple=True,
    metavar="GATE",
    help="Exit 3 when TEST breaches GATE, e.g. 'step_time>+5%', 'data_loader>+2ms', 'gpu_idle>+10%', "
    "'new_high>0' (repeatable; metrics: step_time, data_loader, forward, backward, optimizer, communication, "
    "gpu_idle, other, new_high). A time gate breaches on a change that is significant (its 95% interval "
    "excludes zero) and beyond the threshold, on any rank; exit 4 when no gate breaches but the data cannot "
    "decide one (too few steps, a metric one run lacks).",
)
@analysis_options("diff")
@wide_option
@click.option("--json", "as_json", is_flag=True, help='Print one JSON document (schema "stepscope.diff/3").')
@kept_json("diff", inputs=("base", "test"))
def command(
    base: str,
    test: str,
    top: int,
    factor: float,
    fail_on: tuple[str, ...],
    wide: bool,
    as_json: bool,
    options: AnalysisOptions,
) -> int:
    """Compare BASE and TEST (each a trace, a folder of traces or a run folder): the step time over every plain
    step of run folders, the profiled window's phases per step, findings that appeared, went or changed, kernels
    and ops. `--step` picks the window of run folders; each side's ranks are analysed as `analyze` does
    (`--jobs`, `--executor`)."""
    from stepscope.analysis.diff.gates import evaluate_gates, parse_gate
    from stepscope.cli._common import check_patterns, diff_traces, print_line, print_notes

    if factor <= 1:
        raise click.BadParameter("must be greater than 1", param_hint="--factor")
    for gate in fail_on:
        try:
            parse_gate(gate)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--fail-on") from None
    from stepscope.analysis.read.source import Source

    base_source, test_source = Source(base), Source(test)  # (each side's manifest and config: read once)
    check_patterns(options.comm_patterns)
    result = diff_traces(base_source, test_source, options, factor=factor)
    result.gates = evaluate_gates(result, fail_on)
    if as_json:
        print_json(result)
    else:
        from stepscope.cli._common import console
        from stepscope.report.terminal.diff import DiffReport

        print_notes(result.notices)
        console(wide).print(DiffReport(result, top=top, wide=wide))
    breached = [g for g in result.gates if g.outcome == "breach"]
    undecided = [g for g in result.gates if g.outcome == "undecided"]
    for g in undecided:
        print_line(plain(f"stepscope: --fail-on {g.expression} undecided: {g.reason}"))
    for g in breached:
        print_line(plain(f"stepscope: --fail-on {g.expression} breached: {g.reason}"))
    return EXIT_GATE_BREACHED if breached else EXIT_GATE_UNDECIDED if undecided else 0
