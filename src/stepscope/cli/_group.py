"""The click group of the `stepscope` command: its subcommands (cli/__init__.py's COMMANDS) imported lazily."""

from __future__ import annotations

import importlib
import importlib.util
import os

import click

from stepscope._version import __version__
from stepscope.analysis.read.cache import NO_CACHE_ENV  # (numpy-free: the group still loads no analysis)
from stepscope.cli import ANALYSIS_COMMANDS, COMMANDS, _commands, _env_saved, _env_set, limit_blas_threads


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name, (module, _) in COMMANDS.items() if _module_exists(module)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS or not _module_exists(COMMANDS[cmd_name][0]):
            return None
        _commands.append(cmd_name)
        if cmd_name in ANALYSIS_COMMANDS:
            limit_blas_threads()
        module = importlib.import_module(f"stepscope.cli.{COMMANDS[cmd_name][0]}")
        command: click.Command = module.command
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _module_exists(module: str) -> bool:
    return importlib.util.find_spec(f"stepscope.cli.{module}") is not None


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="stepscope")
@click.option(
    "--no-cache",
    is_flag=True,
    help="Decode every trace anew: neither read nor write the cache of decoded tables (docs/analysis.md).",
)
def cli(no_cache: bool) -> None:
    """stepscope: profile PyTorch training and explain where the step time goes."""
    if no_cache and os.environ.get(NO_CACHE_ENV) != "1":
        # (the pool's processes too; for this command only: main puts back what was there)
        _env_saved.setdefault(NO_CACHE_ENV, os.environ.get(NO_CACHE_ENV))
        os.environ[NO_CACHE_ENV] = "1"
        _env_set.append(NO_CACHE_ENV)
