"""`stepscope ops PATH`: each op's FLOPs, bytes, achieved rates and efficiency against the device's roofline."""

from __future__ import annotations

import click

from stepscope.analysis.options import AnalysisOptions
from stepscope.cli._common import analysis_options, print_json, wide_option
from stepscope.cli._output import kept_json


@click.command(name="ops")
@analysis_options("ops")
@wide_option
@click.argument("path", type=click.Path(path_type=str, readable=False))
@click.option("--top", "top", type=int, default=20, show_default=True, help="Op groups per rank (0: all).")
@click.option("--json", "as_json", is_flag=True, help='Print one JSON document (schema "stepscope.ops/1").')
@kept_json("ops")
def command(path: str, top: int, as_json: bool, wide: bool, options: AnalysisOptions) -> None:
    """How close each op of PATH (a trace, a folder of traces or a run folder) runs to its device's roofline:
    ops grouped by name and input shapes, with their FLOPs and bytes (from the shapes the trace recorded),
    achieved TFLOP/s and TB/s, bound and efficiency, and findings priced in time."""
    from stepscope.analysis.read.source import Source
    from stepscope.analysis.service import ops_analysis
    from stepscope.cli._output import ProgressBar

    with ProgressBar() as bar:
        result = ops_analysis(Source(path), options, progress=bar)
    if as_json:
        print_json(result)
        return
    from stepscope.cli._common import console, print_notes
    from stepscope.report.terminal.ops import OpsReport

    print_notes(result.notices)
    console(wide).print(OpsReport(result, top=top, wide=wide))
