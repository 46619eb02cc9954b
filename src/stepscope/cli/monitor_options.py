"""Every option of the performance monitor as a click flag, generated from `ProfileConfig` (`out_dir` ->
`--out-dir`), and the config they build: shared by `stepscope run`, `stepscope estimate` and `stepscope
nsys-command`."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import click

from stepscope.capture.config import ProfileConfig

# Fields that are not flags of `stepscope run` (it always profiles).
_NOT_FLAGS = {"enabled"}


def _ranks(text: str) -> list[int] | str:
    if text.strip().lower() == "all":
        return "all"
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(f"expected 'all' or comma-separated ranks, got {text!r}") from None


def config_options(fn: Any) -> Any:
    """One click option per ProfileConfig field (`out_dir` -> `--out-dir`); a flag not given keeps the value
    of --config (or the default). Booleans come as `--x/--no-x`."""
    for name, field in reversed(list(ProfileConfig.model_fields.items())):
        if name in _NOT_FLAGS:
            continue
        flag = "--" + name.replace("_", "-")
        help_text = field.description or ""
        annotation = field.annotation
        args = typing.get_args(annotation)
        if annotation is bool:
            fn = click.option(f"{flag}/--no-{flag[2:]}", name, default=None, help=help_text)(fn)
        elif name == "profiled_ranks":
            fn = click.option(flag, name, default=None, metavar="all|R,R,...", help=help_text)(fn)
        elif name == "comm_patterns":
            fn = click.option(flag, name, multiple=True, metavar="REGEX", help=help_text + " Repeatable.")(fn)
        elif typing.get_origin(annotation) is typing.Literal:
            fn = click.option(flag, name, type=click.Choice(list(args)), default=None, help=help_text)(fn)
        else:
            kinds = [a for a in (args or (annotation,)) if a is not type(None)]
            kind = kinds[0] if kinds and kinds[0] in (int, float, str) else str
            fn = click.option(flag, name, type=kind, default=None, help=help_text)(fn)
    return fn


def build_config(config_path: Path | None, values: dict[str, Any]) -> ProfileConfig:
    overrides: dict[str, Any] = {}
    for name, value in values.items():
        if value is None or (name == "comm_patterns" and not value):
            continue
        if name == "profiled_ranks":
            value = _ranks(value)
        elif name == "comm_patterns":
            value = list(value)
        overrides[name] = value
    return ProfileConfig.build(config_path, enabled=True, **overrides)


def config_file_option(fn: Any) -> Any:
    """`--config YAML`: the options from a file first; flags given on the command line override it."""
    return click.option(
        "--config",
        "config_path",
        type=click.Path(path_type=Path),
        default=None,
        metavar="YAML",
        help="Read options from a YAML file first (flags given here override it).",
    )(fn)
