"""`stepscope analyze PATH`: time breakdown, idle causes, overlap, stragglers and findings with advice."""

from __future__ import annotations

from pathlib import Path

import click

from stepscope.cli._common import comm_pattern_option, jobs_options, step_option, wide_option


@click.command(name="analyze")
@step_option
@click.argument("path", type=click.Path(path_type=Path, readable=False))
@click.option(
    "--json", "as_json", is_flag=True, help='Print one JSON document (schema "stepscope.analysis/4").'
)
@click.option(
    "--drop-last-step", is_flag=True, help="Leave the last ProfilerStep out of the window (HTA's default)."
)
@click.option(
    "--steps",
    "step_range",
    metavar="A:B",
    callback=lambda ctx, param, value: _step_range(value),
    help="Analyse only ProfilerStep#A to #B (inclusive; A: or :B leave one end open).",
)
@click.option(
    "--top", default=10, show_default=True, type=click.IntRange(min=1), help="Kernels to list per rank."
)
@comm_pattern_option
@jobs_options
@wide_option
def command(
    path: Path,
    step: int | None,
    as_json: bool,
    drop_last_step: bool,
    step_range: tuple[int | None, int | None] | None,
    top: int,
    comm_patterns: tuple[str, ...],
    jobs: int | None,
    executor: str,
    scheduler: str | None,
    wide: bool,
) -> None:
    """Analyze PATH (a trace file, a folder of per-rank traces, or a run folder).

    A run folder adds what the run measured outside its traces: step times over the whole run, FLOPs / MFU,
    memory and system samples."""
    from stepscope.cli._analysis import run_analyze

    run_analyze(
        path, step, as_json, drop_last_step, step_range, top, comm_patterns, jobs, executor, scheduler, wide
    )


def _step_range(value: str | None) -> tuple[int | None, int | None] | None:
    """`A:B`, `A:`, `:B` or `A` -> (first, last), inclusive."""
    if value is None:
        return None
    first, sep, last = value.partition(":")
    try:
        bounds = (int(first) if first.strip() else None, int(last) if last.strip() else None)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not A:B (step numbers)") from None
    if not sep:
        bounds = (bounds[0], bounds[0])
    if bounds == (None, None) or (None not in bounds and bounds[0] > bounds[1]):  # type: ignore[operator]
        raise click.BadParameter(f"{value!r}: give A <= B") from None
    return bounds
