"""Helpers shared by the CLI subcommands: JSON output and the console (rich is imported only for a console:
`--json` runs do without it)."""

from __future__ import annotations

import re
import sys
from typing import Any

import msgspec

from stepscope.units import BIDI_CODES


def print_json(document: Any) -> None:
    """Print one JSON document (msgspec Structs, dataclasses and plain containers all encode)."""
    # (escaped while compact, and each copy let go before the next is made: the indented text of a job of
    # thousands of ranks is hundreds of MB, and a copy more of it was the command's peak)
    from stepscope.cli._output import recording_now

    text = escape_json_controls(msgspec.json.encode(document))
    text = msgspec.json.format(text, indent=2)
    out = sys.stdout.buffer
    out.write(text)
    record = recording_now()  # (the command's answer is being kept: analyze / summary / whatif --json)
    if record is not None:
        record.add(text + b"\n")
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


def print_line(line: str) -> None:
    """One line on stderr (a gate's verdict), as print_notes prints notes."""
    from stepscope.cli._output import recording_now

    sys.stderr.write(line + "\n")
    sys.stderr.flush()
    record = recording_now()
    if record is not None:
        record.err(line + "\n")


def print_notes(notes: Any) -> None:
    """Notes and notices go to stderr, one line each, so that stdout holds only the answer."""
    from stepscope.cli import note_line
    from stepscope.cli._output import recording_now

    record = recording_now()
    for note in notes:
        line = note_line(note)
        sys.stderr.write(line)
        if record is not None:
            record.err(line)
    sys.stderr.flush()


def load_traces(path: Any, *, step: int | None = None) -> Any:
    """`load_trace` with a progress bar on the terminal when loading takes more than a second."""
    from stepscope.analysis.read.loader import load_trace
    from stepscope.cli._output import ProgressBar

    with ProgressBar() as bar:
        return load_trace(path, step=step, progress=bar)


def report_traces(path: Any, options: Any) -> Any:
    """`collect_report` with a progress bar on the terminal; an executor that cannot run is a usage error."""
    from stepscope.report.data import collect_report

    return with_progress(collect_report, path, options)


def diff_traces(base: Any, test: Any, options: Any, *, factor: float) -> Any:
    """`diff_paths` with a progress bar per side on the terminal; an executor that cannot run is a usage
    error."""
    from stepscope.analysis.diff.compare import diff_paths
    from stepscope.cli._output import ProgressBar

    return with_progress(diff_paths, base, test, options, bar=ProgressBar, factor=factor)


def with_progress(analysis: Any, *arguments: Any, bar: Any = None, **more: Any) -> Any:
    """`analysis(*arguments, progress=..., **more)`: a progress bar (`bar`: a maker of bars the analysis opens
    itself), an ExecutorError as a usage error."""
    from stepscope.analysis.parallel import ExecutorError
    from stepscope.cli._output import ProgressBar

    try:
        if bar is not None:
            return analysis(*arguments, progress=bar, **more)
        with ProgressBar() as progress:
            return analysis(*arguments, progress=progress, **more)
    except ExecutorError as exc:
        import click

        raise click.UsageError(str(exc)) from None


def analysis_options(command: str):  # type: ignore[no-untyped-def]
    """The flags of every AnalysisOptions field `command` offers (analysis/options.py: their help, types and
    defaults are defined there once); the command function takes them as one `options: AnalysisOptions`."""
    import functools

    import click

    from stepscope.analysis.options import fields, with_changes

    offered = fields(command)

    def decorate(fn):  # type: ignore[no-untyped-def]
        @functools.wraps(fn)
        def command_function(**values: Any) -> Any:
            given = {f.name: values.pop(f.name) for f in offered}
            return fn(**values, options=with_changes(None, given))

        for field in reversed(offered):
            command_function = click.option(*_flag_names(field), **_flag_settings(field))(command_function)
        return command_function

    return decorate


def _flag_names(field: Any) -> list[str]:
    flag = field.flag.flag or "--" + field.name.replace("_", "-")
    return [n for n in (field.flag.short, flag, field.name) if n]


def _flag_settings(field: Any) -> dict[str, Any]:
    """click.option's settings for a field of AnalysisOptions (see analysis/options.Field)."""
    import typing

    import click

    settings: dict[str, Any] = {"help": field.flag.help, "default": field.default}
    if field.flag.metavar:
        settings["metavar"] = field.flag.metavar
    kind = field.kind
    if field.flag.parse is not None:
        parse = field.flag.parse

        def read(ctx: Any, param: Any, value: Any) -> Any:
            try:
                return None if value is None else parse(value)
            except ValueError as exc:
                raise click.BadParameter(str(exc)) from None

        settings.update(callback=read, type=str)
    elif kind is bool:
        settings["is_flag"] = True
    elif typing.get_origin(kind) is tuple:  # (tuple[str, ...]: a repeatable flag)
        settings.update(multiple=True, default=())
    elif typing.get_origin(kind) is typing.Literal:
        settings.update(type=click.Choice(list(typing.get_args(kind))), show_default=True)
    elif kind is int:
        settings["type"] = click.IntRange(min=field.flag.minimum) if field.flag.minimum is not None else int
        settings["show_default"] = field.default is not None
    else:
        settings["type"] = kind
    return settings


def check_patterns(given: tuple[str, ...]) -> None:
    """The patterns of `--comm-pattern`, checked: a usage error when one is not a regex or matches every name."""
    if not given:
        return
    import click
    import regex  # (the engine the analysis searches them with: analysis/per_rank/kernels.CommPattern)

    for pattern in given:
        try:
            matches_all = regex.compile(pattern).search("") is not None
        except regex.error as exc:
            message = f"{pattern!r} is not a regular expression ({exc})"
            raise click.BadParameter(message, param_hint="--comm-pattern") from None
        if matches_all:
            message = f"{pattern!r} matches every kernel name (it matches the empty string)"
            raise click.BadParameter(message, param_hint="--comm-pattern")
