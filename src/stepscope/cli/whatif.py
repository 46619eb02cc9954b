"""`stepscope whatif PATH [--scale SELECTOR=FACTOR ...]`: each rank's steps replayed from the trace, measured and
with the selected work scaled; the critical path of the result."""

from __future__ import annotations

import click

from stepscope.analysis.options import AnalysisOptions
from stepscope.cli._common import analysis_options, print_json, wide_option
from stepscope.cli._output import kept_json

_SCALE_HELP = (
    "Scale some work: SELECTOR=FACTOR (repeatable). SELECTOR: data_loader, forward, backward, optimizer, "
    "communication, sync, kernel:REGEX or op:REGEX, optionally @RANKS (@2, @0-3, @0,2). FACTOR: 0 removes the "
    "work, 0.5 halves it."
)


@click.command(name="whatif")
@analysis_options("whatif")
@wide_option
@click.argument("path", type=click.Path(path_type=str, readable=False))
@click.option("--scale", "scale", multiple=True, metavar="SELECTOR=FACTOR", help=_SCALE_HELP)
@click.option("--top", "top", type=int, default=5, show_default=True, help="GPU activities named per step.")
@click.option(
    "--json", "as_json", is_flag=True, help='Print one JSON document (schema "stepscope.whatif/1").'
)
@kept_json("whatif")
def command(
    path: str, scale: tuple[str, ...], top: int, as_json: bool, wide: bool, options: AnalysisOptions
) -> None:
    """Replay PATH's steps (a trace, a folder of traces or a run folder) and predict the step with --scale."""
    from stepscope.analysis.read.source import Source
    from stepscope.analysis.whatif import SelectorError, parse_selector, whatif
    from stepscope.cli._common import load_traces

    try:
        selectors = [parse_selector(s) for s in scale]
    except SelectorError as exc:
        raise click.BadParameter(str(exc), param_hint="--scale") from None
    result = whatif(load_traces(Source(path), step=options.step), selectors, top=top)
    if as_json:
        print_json(result)
        return
    from stepscope.cli._common import console, print_notes
    from stepscope.report.terminal.whatif import render

    print_notes(result.notes)
    out = console(wide)
    for part in render(result, wide=wide):
        out.print(part)
