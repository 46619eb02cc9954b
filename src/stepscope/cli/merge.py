"""`stepscope merge PATH -o merged.json.gz`: every rank in one chrome trace, clocks aligned, collectives linked."""

from __future__ import annotations

from pathlib import Path

import click

from stepscope.analysis.options import AnalysisOptions
from stepscope.cli._common import analysis_options, check_patterns
from stepscope.units import plain


@click.command(name="merge")
@click.argument("path", type=click.Path(path_type=Path, readable=False))
@click.option(
    "-o",
    "--output",
    "output",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="The merged trace (.json.gz or .json), replaced if it exists. Open it at ui.perfetto.dev or with "
    "`stepscope analyze`. Default: merged.json.gz here, or merged-2.json.gz, ... when that exists.",
)
@analysis_options("merge")
def command(path: Path, output: Path | None, options: AnalysisOptions) -> None:
    """Merge the per-rank traces of PATH (a folder of traces or a run folder) into one trace.

    Every rank becomes a process "rank N"; clocks are aligned on the collectives the ranks share (see
    docs/analysis.md, "Across ranks"), and flow arrows link each collective across ranks."""
    from stepscope.analysis.cross_rank.merge import merge_traces
    from stepscope.analysis.cross_rank.merge_select import alignment_table
    from stepscope.analysis.per_rank.kernels import compile_patterns
    from stepscope.analysis.run.folder import recorded_groups
    from stepscope.cli._output import output_target

    if output is None:
        output = unused_name(DEFAULT_OUTPUT)
        if output != DEFAULT_OUTPUT:
            click.echo(
                f"note: {DEFAULT_OUTPUT} exists (kept); writing {plain(output)}. -o names the file", err=True
            )
    output_target(output, "the merged trace")  # before the traces are read: a bad -o is said at once
    from stepscope.analysis.read.source import Source

    source = Source(path)  # (what PATH is, its manifest and config: read once for the whole command)
    check_patterns(options.comm_patterns)
    patterns = list(source.comm_patterns(options.comm_patterns))  # (a run folder's config's first)
    # the events alignment needs, found by streaming each file: memory does not grow with the events
    table = alignment_table(source, step=options.step, patterns=compile_patterns(patterns))
    known = recorded_groups(source)  # (a run folder's record of its process groups; None for traces)
    info = merge_traces(table, output, comm_patterns=patterns, known_groups=known)
    for notice in table.notices:
        click.echo(f"note: {plain(notice)}", err=True)
    a = info.alignment
    if a is None:
        how = "one rank: nothing to align"
    elif a.method == "collectives":
        offsets = ", ".join(f"rank {r.rank} {r.offset_us / 1e3:+.3f} ms" for r in a.ranks)
        how = f"clocks aligned on {a.matched} matched collectives ({offsets})"
    else:
        how = "no collective matched across ranks: raw clocks kept"
    ranks = "1 rank" if len(info.ranks) == 1 else f"{len(info.ranks)} ranks"
    click.echo(f"{plain(output)}: {ranks}, {how}, {info.flows} flow arrows")


DEFAULT_OUTPUT = Path("merged.json.gz")


def unused_name(path: Path) -> Path:
    """`path`, or where something (a file, a link, even a broken one) is there already, the first of
    name-2.json.gz, name-3.json.gz, ... that is free: a merge without -o never replaces an earlier one."""
    stem, suffixes = path.name.split(".", 1)
    candidate, n = path, 1
    while candidate.exists() or candidate.is_symlink():
        n += 1
        candidate = path.with_name(f"{stem}-{n}.{suffixes}")
    return candidate
