"""`stepscope memory SNAPSHOT`: analyze a CUDA memory snapshot or a memory timeline, never running code
from the file."""

from __future__ import annotations

from pathlib import Path

import click

from stepscope.cli._common import console, print_json
from stepscope.units import plain


@click.command(name="memory")
@click.argument("snapshot", type=click.Path(path_type=Path, readable=False))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (schema stepscope.memory/1).")
@click.option(
    "--html",
    "html_out",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Also write a self-contained HTML page here.",
)
@click.option(
    "--top",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="Rows in the blocks and call-site tables.",
)
def command(snapshot: Path, as_json: bool, html_out: Path | None, top: int) -> None:
    """Analyze SNAPSHOT: a torch.cuda.memory._dump_snapshot pickle (gzip'd or not) or the JSON of
    export_memory_timeline. Only plain containers and scalars are unpickled."""
    from stepscope.analysis.memory.model import to_document
    from stepscope.analysis.memory.snapshot import analyze_memory_file
    from stepscope.report.memory import MemoryView, memory_html

    if html_out is not None:
        from stepscope.cli._output import output_target, write_output

        output_target(html_out, "the memory page")  # before the snapshot is read: a bad -o is said at once
    report = analyze_memory_file(snapshot, top=top)
    if html_out is not None:
        write_output(html_out, memory_html(report), "the memory page")
    if as_json:
        print_json(to_document(report))
    else:
        from stepscope.cli._common import print_notes

        print_notes(report.notes)
        console().print(MemoryView(report))
    if html_out is not None:
        click.echo(f"HTML report: {plain(html_out)}", err=as_json)
