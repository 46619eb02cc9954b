"""`stepscope summary PATH`: top CPU ops by self time and GPU kernels by total time, per rank."""

from __future__ import annotations

import click

from stepscope.analysis.options import AnalysisOptions
from stepscope.cli._common import analysis_options, print_json, wide_option
from stepscope.cli._output import kept_json


@click.command(name="summary")
@analysis_options("summary")
@wide_option
@click.argument("path", type=click.Path(path_type=str, readable=False))
@click.option("--top", "top", type=int, default=10, show_default=True, help="Rows per table (0: all).")
@click.option(
    "--json", "as_json", is_flag=True, help='Print one JSON document (schema "stepscope.summary/1").'
)
@kept_json("summary")
def command(path: str, top: int, as_json: bool, wide: bool, options: AnalysisOptions) -> None:
    """Top CPU ops and GPU kernels of PATH: a trace, a folder of traces or a run folder."""
    from stepscope.analysis.per_rank.summary import summarize
    from stepscope.analysis.read.source import Source
    from stepscope.cli._common import load_traces

    summary = summarize(load_traces(Source(path), step=options.step), top=top)
    if as_json:
        print_json(summary)
        return
    from stepscope.cli._common import console, print_notes
    from stepscope.report.terminal.summary import SummaryReport

    print_notes(summary.notices)
    console(wide).print(SummaryReport(summary, wide=wide))
