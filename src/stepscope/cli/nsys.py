"""`stepscope nsys-command [options] -- CMD...`: the Nsight Systems command that records the same windows as
stepscope's schedule. `stepscope run --nsys` launches it."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import click

from stepscope.capture.config import ProfileConfig
from stepscope.cli.monitor_options import build_config, config_file_option, config_options
from stepscope.errors import InputError
from stepscope.units import plain

NSYS_TRACE = "cuda,nvtx,osrt"


def nsys_argv(config: ProfileConfig, inner: list[str]) -> list[str]:
    """`nsys profile ...` around the command `inner`, which runs a monitor with nsight=True: only the ranges
    between its cudaProfilerStart/Stop (the active windows) are recorded, one report per window."""
    if config.on_demand or config.repeat == 0:
        range_end = "repeat"
    elif config.repeat > 1:
        range_end = f"repeat:{config.repeat}"
    else:
        range_end = "stop"
    output = Path(config.out_dir) / "nsys" / "stepscope_%h_%p"
    argv = [
        "nsys",
        "profile",
        f"--trace={NSYS_TRACE}",
        "--capture-range=cudaProfilerApi",
        f"--capture-range-end={range_end}",
        f"--output={output}",
        "--force-overwrite=true",
    ]
    if config.profile_memory:
        argv.append("--cuda-memory-usage=true")
    return argv + inner


def profiled_command(config: ProfileConfig, cmd: list[str]) -> tuple[list[str], list[str]]:
    """The command nsys should launch for `cmd`, and notes. A Python script or module is run through
    `stepscope run --nsight` with the options as flags; any other command is kept and must run a monitor with
    nsight=True itself."""
    notes: list[str] = []
    python = None
    rest = list(cmd)
    interpreter: list[str] = []
    if rest and Path(rest[0]).name.startswith("python"):
        python, rest = rest[0], rest[1:]
        while rest and rest[0].startswith("-") and rest[0] not in ("-m", "-c"):
            interpreter.append(rest.pop(0))  # the interpreter's own flags (-u, -X dev, ...) stay with it
    if rest and (rest[0] == "-m" or rest[0].endswith(".py")):
        if rest[:3] == ["-m", "stepscope", "run"]:
            notes.append("CMD already runs `stepscope run`: add --nsight to its options")
            return list(cmd), notes
        flags = _flags(config)
        return [python or "python", *interpreter, "-m", "stepscope", "run", *flags, *rest], notes
    notes.append(
        "CMD is not `[python] script.py ...` or `[python] -m module ...`, so the options given here are not "
        "passed to it: it must run a stepscope monitor with nsight=True (and trace=False) itself, e.g. "
        "`torchrun ... -m stepscope run --nsight --no-trace [options] train.py`"
    )
    return list(cmd), notes


def _flags(config: ProfileConfig) -> list[str]:
    """The options of `config` that differ from the defaults, as `stepscope run` flags."""
    default = ProfileConfig.build()
    flags: list[str] = []
    for name in ProfileConfig.model_fields:
        value, base = getattr(config, name), getattr(default, name)
        if name == "enabled" or value == base:
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else f"--no-{flag[2:]}")
        elif name == "profiled_ranks":
            flags += [flag, value if isinstance(value, str) else ",".join(map(str, value))]
        elif name == "comm_patterns":
            for pattern in value:
                flags += [flag, pattern]
        else:
            flags += [flag, str(value)]
    return flags


@click.command(name="nsys-command")
@config_file_option
@config_options
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED, required=True)
def command(config_path: Path | None, cmd: tuple[str, ...], **values: Any) -> int:
    """Print the `nsys profile` command that records exactly stepscope's active windows of CMD.

    Usage: stepscope nsys-command [options] -- python train.py args...

    The options are those of `stepscope run`. The command traces cuda,nvtx,osrt; its capture range is the
    CUDA profiler API, which the monitor starts and stops around each active window (nsight=True), with an NVTX
    range per step (`stepscope step N`) and per region. torch.profiler traces are off under nsys (trace=False):
    both need CUPTI.
    """
    if config_path is not None and not config_path.is_file():
        raise InputError(config_path, "no such file")
    config = build_config(config_path, values)
    config = config.model_copy(update={"nsight": True, "trace": values.get("trace") or False})
    inner, notes = profiled_command(config, list(cmd))
    click.echo(plain(shlex.join(nsys_argv(config, inner))))
    for note in notes:
        sys.stderr.write(f"stepscope: note: {plain(note)}\n")
    return 0
