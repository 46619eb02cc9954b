"""`stepscope estimate [options] script.py args...`: the trace size of each window for a config, from a few
steps of a dry run of the script (the options are those of `stepscope run`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from stepscope.cli.monitor_options import build_config, config_file_option, config_options
from stepscope.cli.run import ScriptCommand, resolve_target
from stepscope.errors import InputError, StepscopeError


@click.command(name="estimate", cls=ScriptCommand, context_settings={"allow_interspersed_args": False})
@config_file_option
@click.option("-m", "module", default=None, metavar="MODULE", help="Run a module as `python -m MODULE` does.")
@click.option(
    "--json", "as_json", is_flag=True, help='Print one JSON document (schema "stepscope.estimate/1").'
)
@config_options
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def command(
    config_path: Path | None,
    module: str | None,
    as_json: bool,
    script_args: tuple[str, ...],
    **values: Any,
) -> None:
    """Expected trace size per window for these options: `stepscope estimate [options] train.py args...`.

    Runs the script as `stepscope run` does until one warmup and 2 measured optimizer steps are recorded and
    exported (in a temporary folder), stops it, and extrapolates to --active steps. The script's output goes
    to stderr; stdout holds only the estimate.
    """
    if config_path is not None and not config_path.is_file():
        raise InputError(config_path, "no such file")
    config = build_config(config_path, values)
    target, args = resolve_target(module, script_args)
    try:
        import torch  # noqa: F401
    except ImportError:
        raise StepscopeError("estimate runs the script under torch.profiler: install torch") from None
    from stepscope.capture.estimate import estimate_lines, estimate_target

    estimate = estimate_target(target, args, module=module is not None, config=config)
    if as_json:
        from stepscope.cli._common import print_json

        print_json(estimate.as_document())
        return
    click.echo("\n".join(estimate_lines(estimate)))
