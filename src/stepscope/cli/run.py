"""`stepscope run [options] script.py args...` / `stepscope run [options] -m module args...`: profile an
unmodified training script. Every option of the performance monitor is a flag here (`--wait 5`,
`--profile-memory`, `--profiled-ranks all`, ...), generated from `ProfileConfig`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import click

from stepscope.capture.config import ProfileConfig
from stepscope.cli.monitor_options import build_config, config_file_option, config_options
from stepscope.cli.nsys import nsys_argv
from stepscope.errors import InputError, StepscopeError


class ScriptCommand(click.Command):
    """A command whose own options end where the script begins (`train.py`, or `-m MODULE` as with python):
    an unknown option before it is a usage error, and everything after it is the script's, passed on
    unchanged (its `--help`, its `--wait`, its `--`)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        start = script_start(self.get_params(ctx), args)
        if start is not None:
            args = [*args[:start], "--", *args[start:]]
        return super().parse_args(ctx, args)


def script_start(params: list[click.Parameter], args: list[str]) -> int | None:
    """The index in `args` where the script's own arguments begin: the script, or what follows `-m MODULE`.
    None where click's parser decides alone: an explicit `--`, an option it does not know (it says so), or no
    script at all."""
    takes_value: dict[str, bool] = {}
    for param in params:
        if isinstance(param, click.Option):
            for flag in (*param.opts, *param.secondary_opts):
                takes_value[flag] = not (param.is_flag or param.count)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return None
        if not arg.startswith("-") or arg == "-":
            return i
        if arg.startswith("-m") and not arg.startswith("--") and "-m" in takes_value:
            end = i + 1 if len(arg) > 2 else i + 2  # -mpkg or -m pkg: the module's arguments follow
            return end if end <= len(args) else None
        name = arg.split("=", 1)[0] if arg.startswith("--") else arg
        if name not in takes_value:
            return None
        i += 2 if takes_value[name] and name == arg else 1
    return None


@click.command(name="run", cls=ScriptCommand, context_settings={"allow_interspersed_args": False})
@config_file_option
@click.option("-m", "module", default=None, metavar="MODULE", help="Run a module as `python -m MODULE` does.")
@click.option(
    "--nproc-per-node",
    type=click.IntRange(min=1),
    default=None,
    help="Launch N processes on this machine with torchrun (--standalone); one run folder for the job.",
)
@click.option(
    "--nsys",
    is_flag=True,
    help="Launch under Nsight Systems (nsys on PATH), recording only the active windows "
    "(see `stepscope nsys-command`).",
)
@config_options
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def command(
    config_path: Path | None,
    module: str | None,
    nproc_per_node: int | None,
    nsys: bool,
    script_args: tuple[str, ...],
    **values: Any,
) -> int:
    """Profile an unmodified script: `stepscope run [options] train.py args...` or `... -m pkg.train args...`.

    Steps are the optimizer's steps (torch.optim); step 0 begins when the optimizer first steps. The script sees
    its own argv, stdout, exit code and exceptions; stepscope's own messages go to stderr. Under torchrun:
    `torchrun --nproc_per_node 2 -m stepscope run train.py ...`, or `--nproc-per-node 2` here.
    """
    if config_path is not None and not config_path.is_file():
        raise InputError(config_path, "no such file")
    config = build_config(config_path, values)
    target, args = resolve_target(module, script_args)
    if nsys:
        if shutil.which("nsys") is None:
            raise StepscopeError(
                "--nsys: nsys (Nsight Systems) is not on PATH; install it, or print the command with "
                "`stepscope nsys-command` and run it where nsys is"
            )
        config = config.model_copy(update={"nsight": True, "trace": values.get("trace") or False})
        inner = _launch_argv(config, target, args, module is not None, nproc_per_node)
        return _run_child(nsys_argv(config, inner[0]), inner[1])
    if nproc_per_node is not None:
        argv, config_file = _launch_argv(config, target, args, module is not None, nproc_per_node)
        return _run_child(argv, config_file)
    from stepscope.capture.run_script import run_target

    return run_target(target, args, module=module is not None, config=config)


def resolve_target(module: str | None, script_args: tuple[str, ...]) -> tuple[str, list[str]]:
    """The script (or module) to run and its arguments; InputError when it does not exist."""
    command = click.get_current_context().info_name or "run"
    if module is None:
        if not script_args:
            raise click.UsageError(
                f"give a script (stepscope {command} [options] train.py args...) or -m MODULE"
            )
        target, args = script_args[0], list(script_args[1:])
        if not Path(target).is_file():
            raise InputError(target, "no such file (give a Python script, or -m MODULE)")
        return target, args
    import importlib.util

    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise InputError(module, "no module of that name (give a module importable from here, or a script)")
    return module, list(script_args)


def _launch_argv(
    config: ProfileConfig, target: str, args: list[str], module: bool, nproc: int | None
) -> tuple[list[str], Path]:
    """The command that runs `stepscope run` again in a child (under torchrun when `nproc` is given), with the
    resolved config in a temp YAML file (removed when the child ends)."""
    fd, name = tempfile.mkstemp(prefix="stepscope-run-", suffix=".yaml")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(config.to_yaml())
    inner = [sys.executable, "-m", "stepscope", "run", "--config", name]
    inner += ["-m", target, *args] if module else [target, *args]
    if nproc is None:
        return inner, Path(name)
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    return launcher + inner[1:], Path(name)


def _run_child(argv: list[str], config_file: Path) -> int:
    try:
        return subprocess.call(argv)
    except KeyboardInterrupt:
        return 130
    finally:
        config_file.unlink(missing_ok=True)
