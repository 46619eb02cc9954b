"""`stepscope diff BASE TEST`: what changed between two runs or traces."""

from __future__ import annotations

import click

from stepscope.cli._common import print_json


@click.command(name="diff")
@click.argument("base", type=click.Path(path_type=str, readable=False))
@click.argument("test", type=click.Path(path_type=str, readable=False))
@click.option("--top", type=int, default=10, show_default=True, help="Rows per table.")
@click.option(
    "--factor",
    type=float,
    default=5.0,
    show_default=True,
    help="Flag kernels and ops whose mean duration changed by this factor or more.",
)
@click.option("--json", "as_json", is_flag=True, help='Print one JSON document (schema "stepscope.diff/1").')
def command(base: str, test: str, top: int, factor: float, as_json: bool) -> None:
    """Compare BASE and TEST (each a trace, a folder of traces or a run folder)."""
    from stepscope.analysis.diff import diff_tables
    from stepscope.cli._common import load_traces

    if factor <= 1:
        raise click.BadParameter("must be greater than 1", param_hint="--factor")
    result = diff_tables(load_traces(base), load_traces(test), base_path=base, test_path=test, factor=factor)
    if as_json:
        print_json(result)
        return
    from stepscope.report.diff import DiffReport
    from stepscope.report.terminal import make_console

    for notice in result.notices:
        click.echo(f"stepscope: note: {notice}", err=True)
    make_console().print(DiffReport(result, top=top))
