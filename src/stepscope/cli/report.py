"""`stepscope report PATH`: one self-contained HTML page of a run, a trace or a folder of traces."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from stepscope.analysis.options import AnalysisOptions
from stepscope.analysis.read.source import Source, as_source
from stepscope.cli._common import analysis_options


@click.command(name="report")
@click.argument("path", type=click.Path(path_type=Path, readable=False))
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    default=None,
    help="Where to write the page (default: report.html in a run folder, else PATH's name + .report.html).",
)
@click.option(
    "--compare",
    "compare",
    type=click.Path(path_type=Path, readable=False),
    default=None,
    metavar="TEST",
    help="Make the page of the diff of PATH (the base) and TEST instead.",
)
@click.option("--open", "open_browser", is_flag=True, help="Open the page in the default browser.")
@analysis_options("report")
def command(
    path: Path, output: Path | None, compare: Path | None, open_browser: bool, options: AnalysisOptions
) -> None:
    """Write one HTML page about PATH (a run folder, a trace file or a folder of traces) that works offline:
    findings, step breakdown, kernels and ops, GPU time, communication, ranks, FLOPs, memory, system.

    With --compare TEST, the page shows what changed from PATH to TEST. The ranks of a folder are analysed as
    `analyze` does (`--jobs`, `--executor`)."""
    from stepscope.cli import written_line
    from stepscope.cli._common import print_notes
    from stepscope.cli._output import answer_key, keep_answer, keep_line, kept_answer, page_now

    source = Source(path)  # (what PATH is, its manifest and config: read once for the whole command)
    other = Source(compare) if compare is not None else None
    if other is not None:
        target = output or Path(f"{_stem(path)}_vs_{_stem(other.path)}.compare.html")
    else:
        target = output or default_output(source)
    inputs = [path] if compare is None else [path, compare]
    params = {"path": path, "compare": compare, "options": options}  # (not where it goes: the same page)
    keyed = answer_key(
        "report", inputs, exclude=target, **params
    )  # (the page kept for the same input, if any)
    name = keyed.name
    kept = kept_answer(name)
    made_now = kept is None
    if kept is None:
        kept = _page(source, other, options)
        page = kept.page or b""
    else:
        page = page_now(kept)
    print_notes(kept.notes)
    _write(page, target)
    indexed = source.is_run_folder and target.resolve().parent == path.resolve()
    if indexed:
        _index(path, target)
    if made_now:
        keep_answer(name, kept)
    if source.is_run_folder:  # (and under the folder as it is now that the page is indexed in it)
        after = answer_key("report", inputs, exclude=target, **params).name
        if after != name:
            keep_answer(after, kept)
    if not indexed:  # (a page indexed in its run folder is written again through here: the manifest changes)
        keep_line(keyed, target)
    click.echo(written_line(target, len(page)))
    if open_browser:
        import webbrowser

        webbrowser.open(target.resolve().as_uri())


def _page(source: Source, other: Source | None, options: AnalysisOptions) -> Any:
    """The page of `source` (or of its diff with `other`) and its notes, as a `Kept` (cli/_output.py)."""
    from stepscope.cli._common import check_patterns
    from stepscope.cli._output import Kept
    from stepscope.report.html import render_compare, render_report

    check_patterns(options.comm_patterns)  # (each input's run folder patterns are added by the analysis)
    if other is not None:
        from stepscope.analysis.diff.compare import DEFAULT_FACTOR
        from stepscope.cli._common import diff_traces

        result = diff_traces(source, other, options, factor=DEFAULT_FACTOR)
        return Kept(page=render_compare(result).encode("utf-8"), notes=[str(n) for n in result.notices])
    from stepscope.cli._common import report_traces

    data = report_traces(source, options)
    notes = [str(n) for n in (*data.analysis.notices, *data.notes)]
    return Kept(page=render_report(data).encode("utf-8"), notes=notes, generated=data.generated)


def _write(html: bytes, target: Path) -> None:
    """Write the page: one line and exit 2 for a target that is not a regular file, or that cannot be written."""
    from stepscope.cli._output import write_output

    write_output(target, html, "the report")


def default_output(path: Path | Source) -> Path:
    source = as_source(path)
    if source.is_run_folder:
        return source.path / "report.html"
    return Path(f"{_stem(source.path)}.report.html")


def _stem(path: Path) -> str:
    try:
        name = path.resolve().name or "trace"
    except (RuntimeError, OSError):  # a loop of symbolic links: the command then says so, in one line
        name = path.name or "trace"
    for suffix in (".gz", ".json"):
        name = name.removesuffix(suffix)
    return name


INDEX_LOCK_WAIT_S = 10.0  # the page is written; indexing it never waits longer for another holder of the lock


def _index(run_dir: Path, report: Path) -> None:
    """Record the page in the run folder's manifest (kind `report`); a lock held too long, or a folder that
    cannot be written, is a note: the page itself is there."""
    from stepscope.cli._common import print_notes
    from stepscope.runfolder import Artifact, ArtifactKind, relpath, update_manifest

    artifact = Artifact(str(ArtifactKind.REPORT), relpath(run_dir, report))
    try:
        update_manifest(run_dir, artifacts=[artifact], timeout=INDEX_LOCK_WAIT_S)
    except (TimeoutError, OSError) as exc:
        cause = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        print_notes([f"{run_dir / 'manifest.json'}: the report is not indexed ({cause})"])
