"""Helpers shared by the CLI subcommands: JSON output and the console."""

from __future__ import annotations

import sys
from typing import Any

import msgspec

from stepscope.report.terminal import make_console


def print_json(document: Any) -> None:
    """Print one JSON document (msgspec Structs, dataclasses and plain containers all encode)."""
    sys.stdout.buffer.write(msgspec.json.format(msgspec.json.encode(document), indent=2) + b"\n")
    sys.stdout.flush()


def console():  # type: ignore[no-untyped-def]
    return make_console()


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
    from stepscope.analysis.loader import load_trace
    from stepscope.cli._progress import ProgressBar

    with ProgressBar() as bar:
        return load_trace(path, step=step, progress=bar)
