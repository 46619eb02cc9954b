"""Helpers shared by the CLI subcommands: JSON output and the console (rich is imported only for a console:
`--json` runs do without it)."""

from __future__ import annotations

import re
import sys
from typing import Any

import msgspec

from stepscope.units import BIDI_CODES, plain


def print_json(document: Any) -> None:
    """Print one JSON document (msgspec Structs, dataclasses and plain containers all encode)."""
    # (escaped while compact, and each copy let go before the next is made: the indented text of a job of
    # thousands of ranks is hundreds of MB, and a copy more of it was the command's peak)
    text = escape_json_controls(msgspec.json.encode(document))
    text = msgspec.json.format(text, indent=2)
    out = sys.stdout.buffer
    out.write(text)
    del text
    out.write(b"\n")
    sys.stdout.flush()


# msgspec escapes C0 controls; DEL, the C1 controls and the bidirectional ones it writes as they are. In UTF-8
# JSON these byte sequences are those characters and nothing else, and they occur only inside strings, where
# \uXXXX reads back as the same character.
_RAW_IN_JSON = re.compile(
    "|".join(
        re.escape(chr(c).encode("utf-8")).decode("latin-1") for c in (0x7F, *range(0x80, 0xA0), *BIDI_CODES)
    ).encode("latin-1")
)


def escape_json_controls(text: bytes) -> bytes:
    """UTF-8 JSON `text` with DEL, the C1 and the bidirectional controls as \\uXXXX escapes: the document reads
    back the same, and a terminal showing it is never driven by it (U+009B is a CSI on many terminals)."""
    return _RAW_IN_JSON.sub(lambda m: b"\\u%04x" % ord(m.group().decode("utf-8")), text)


WIDE_CONSOLE = 4096  # --wide: tables as wide as their longest name; free text still wraps at this width


def console(wide: bool = False):  # type: ignore[no-untyped-def]
    from stepscope.report.terminal import make_console

    return make_console(width=WIDE_CONSOLE) if wide else make_console()


def wide_option(fn):  # type: ignore[no-untyped-def]
    """`--wide`: names in full in the tables (they are shortened to fit the terminal otherwise)."""
    import click

    return click.option(
        "--wide", is_flag=True, help="Print names in full (tables may then be wider than the terminal)."
    )(fn)


def print_notes(notes: Any) -> None:
    """Notes and notices go to stderr, one line each, so that stdout holds only the answer."""
    for note in notes:
        sys.stderr.write(f"stepscope: note: {plain(note)}\n")
    sys.stderr.flush()


def step_option(fn):  # type: ignore[no-untyped-def]
    """`--step S`: for a run folder, analyze the window ending at step S (default: each rank's latest)."""
    import click

    return click.option(
        "--step",
        type=click.IntRange(min=0),
        default=None,
        help="Run folders: the profiled window ending at this step (default: each rank's latest).",
    )(fn)


def load_traces(path: Any, *, step: int | None = None) -> Any:
    """`load_trace` with a progress bar on the terminal when loading takes more than a second."""
    from stepscope.analysis.read.loader import load_trace
    from stepscope.cli._progress import ProgressBar

    with ProgressBar() as bar:
        return load_trace(path, step=step, progress=bar)


def analyze_traces(path: Any, **options: Any) -> Any:
    """`analyze_path` with a progress bar on the terminal; an executor that cannot run is a usage error."""
    from stepscope.analysis.parallel import analyze_path

    return _with_progress(analyze_path, path, **options)


def report_traces(path: Any, **options: Any) -> Any:
    """`collect_report` with a progress bar on the terminal; an executor that cannot run is a usage error."""
    from stepscope.analysis.report_data import collect_report

    return _with_progress(collect_report, path, **options)


def diff_traces(base: Any, test: Any, **options: Any) -> Any:
    """`diff_paths` with a progress bar per side on the terminal; an executor that cannot run is a usage
    error."""
    from stepscope.analysis.diff.compare import diff_paths
    from stepscope.cli._progress import ProgressBar

    return _with_progress(diff_paths, base, test, bar=ProgressBar, **options)


def _with_progress(analysis: Any, *paths: Any, bar: Any = None, **options: Any) -> Any:
    """`analysis(*paths, progress=..., **options)`: a progress bar (`bar`: a maker of bars the analysis opens
    itself), an ExecutorError as a usage error."""
    from stepscope.analysis.parallel import ExecutorError
    from stepscope.cli._progress import ProgressBar

    try:
        if bar is not None:
            return analysis(*paths, progress=bar, **options)
        with ProgressBar() as progress:
            return analysis(*paths, progress=progress, **options)
    except ExecutorError as exc:
        import click

        raise click.UsageError(str(exc)) from None


def jobs_options(fn):  # type: ignore[no-untyped-def]
    """`--jobs N`, `--executor local|dask`, `--scheduler ADDRESS`: where the per-rank analyses run."""
    import click

    fn = click.option(
        "--scheduler",
        metavar="ADDRESS",
        default=None,
        help="With --executor dask: the scheduler (tcp://host:8786); the workers must see PATH at the same "
        "path. Default: a local cluster.",
    )(fn)
    fn = click.option(
        "--executor",
        type=click.Choice(["local", "dask"]),
        default="local",
        show_default=True,
        help="Where the per-rank analyses run: local processes, or a Dask cluster (stepscope[dask]).",
    )(fn)
    return click.option(
        "--jobs",
        "-j",
        type=click.IntRange(min=1),
        default=None,
        help="Local processes analysing ranks side by side, or reading one big plain-JSON file in stretches "
        "(default: all CPUs, none for less than 8 MB of JSON; 1: none).",
    )(fn)


def comm_pattern_option(fn):  # type: ignore[no-untyped-def]
    """`--comm-pattern REGEX` (repeatable): more GPU kernel names that are communication."""
    import click

    return click.option(
        "--comm-pattern",
        "comm_patterns",
        multiple=True,
        metavar="REGEX",
        help="GPU kernels whose names match REGEX are communication too (repeatable; a run folder's "
        "config adds its comm_patterns).",
    )(fn)


def comm_patterns(path: Any, given: tuple[str, ...]) -> list[str]:
    """The patterns of `--comm-pattern` (checked: a usage error when one is not a regex or matches every
    name), after those of the run folder's config when PATH is a run folder."""
    for pattern in given:
        import click
        import regex  # (the engine the analysis searches them with: analysis/rank/kernels.CommPattern)

        try:
            matches_all = regex.compile(pattern).search("") is not None
        except regex.error as exc:
            message = f"{pattern!r} is not a regular expression ({exc})"
            raise click.BadParameter(message, param_hint="--comm-pattern") from None
        if matches_all:
            message = f"{pattern!r} matches every kernel name (it matches the empty string)"
            raise click.BadParameter(message, param_hint="--comm-pattern")
    from stepscope.analysis.read.source import as_source

    source = as_source(path)
    if not source.is_run_folder:
        return list(given)
    patterns = source.config([]).get("comm_patterns")
    configured = (
        [p for p in patterns if isinstance(p, str) and _compiles(p)] if isinstance(patterns, list) else []
    )
    return configured + list(given)


def _compiles(pattern: str) -> bool:
    import regex

    try:
        regex.compile(pattern)
    except regex.error:
        return False
    return True
