"""The `stepscope` command. Subcommands live one per module in this package and are imported lazily,
so `stepscope --help` does not pay for numpy, torch or the analyzers. This is the only place where errors
become messages and exit codes."""

from __future__ import annotations

import gc
import importlib
import importlib.util
import os
import sys
from collections.abc import Sequence

import click

from stepscope._version import __version__
from stepscope.errors import StepscopeError
from stepscope.units import plain

# subcommand name -> (module under stepscope.cli, one-line help shown by `stepscope --help`)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("demo", "Profile the bundled CPU demo training; print the summary and the run folder."),
    "summary": ("summary", "Top CPU ops and GPU kernels of a trace, a folder of traces or a run folder."),
    "analyze": ("analyze", "Time breakdown, idle causes, overlap, stragglers and findings with advice."),
    "diff": ("diff", "What changed between two runs or traces."),
    "report": ("report", "One self-contained HTML page of a run or trace (--compare TEST: of a diff)."),
    "whatif": (
        "whatif",
        "Replay the steps from the trace; predict the step with some work scaled (--scale).",
    ),
    "merge": ("merge", "Every rank in one trace for Perfetto: clocks aligned, collectives linked."),
    "memory": ("memory", "Analyze a CUDA memory snapshot (never unpickles arbitrary objects)."),
    "run": ("run", "Profile an unmodified script: stepscope run [options] train.py args (or -m module)."),
    "estimate": (
        "estimate",
        "Expected trace size per window for a config, from a short dry run of a script.",
    ),
    "nsys-command": ("nsys", "Print the nsys command that records exactly the active windows of a command."),
    "bench": ("bench", "Profile each variant of a registry of components in isolation and compare them."),
    "trigger": ("trigger", "Make a running on-demand job (on_demand=True) record its next window."),
}
# Commands that run only our code: when they are done, the process's exit skips the collector's passes over every
# object left (gc.freeze: about 20 ms of a 0.2 s command). Not `run`, `demo`, `estimate`, `bench`: the training
# code they run may count on finalizers at exit.
FREEZE_AT_EXIT = frozenset(
    {"summary", "analyze", "whatif", "diff", "report", "merge", "memory", "nsys-command", "trigger"}
)
# Commands that print and write nothing else: their process ends without the interpreter's teardown.
EXIT_AT_ONCE = frozenset({"analyze"})
# numpy's OpenBLAS starts a thread per CPU when numpy is imported, unless one of these says how many: the analyses
# never call BLAS, and on 2 busy cores those threads' start and spin cost ~50 ms of a 0.2 s analyze.
BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
_invoked: list[str] = []
_blas_env_set: list[str] = []


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name, (module, _) in COMMANDS.items() if _module_exists(module)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS or not _module_exists(COMMANDS[cmd_name][0]):
            return None
        _invoked.append(cmd_name)
        if cmd_name in FREEZE_AT_EXIT and not any(var in os.environ for var in BLAS_THREAD_VARS):
            os.environ[BLAS_THREAD_VARS[0]] = "1"  # (for this command only: main takes it back)
            _blas_env_set.append(BLAS_THREAD_VARS[0])
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
def cli() -> None:
    """stepscope: profile PyTorch training and explain where the step time goes."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 2 bad input or usage). Every failure is one line on stderr,
    its text from files and arguments escaped (`plain`): a name never drives the terminal."""
    try:
        result = cli.main(
            args=list(argv) if argv is not None else None, prog_name="stepscope", standalone_mode=False
        )
    except StepscopeError as exc:
        return _error(str(exc), exc.exit_code)
    except click.exceptions.Abort:
        click.echo("stepscope: aborted", err=True)
        return 130
    except click.exceptions.NoArgsIsHelpError as exc:  # `stepscope` alone: the help
        exc.show()
        return exc.exit_code
    except click.ClickException as exc:
        return _usage_error(exc)
    except BrokenPipeError:
        return 0
    except OSError as exc:  # a file or folder the command met on its way (a folder without search permission)
        where = f"{exc.filename}: " if exc.filename is not None else ""
        return _error(f"{where}{exc.strerror or exc}", 2)
    except RecursionError:  # a reader of nested input that has no depth limit of its own
        return _error("the input is nested too deeply to be read", 2)
    except OverflowError as exc:
        return _error(f"a number in the input is out of range ({exc})", 2)
    finally:
        while _blas_env_set:
            os.environ.pop(_blas_env_set.pop(), None)
    return result if isinstance(result, int) else 0


def _error(message: str, status: int) -> int:
    click.echo(f"stepscope: error: {plain(message)}", err=True)
    return status


def _usage_error(exc: click.ClickException) -> int:
    """A usage error in one line (click's own is three or four): the command, the problem, where help is."""
    ctx = getattr(exc, "ctx", None)
    command = ctx.command_path if ctx is not None else "stepscope"
    hint = f" (see '{command} --help')" if ctx is not None else ""
    click.echo(f"{command}: error: {plain(exc.format_message())}{hint}", err=True)
    return exc.exit_code


def run() -> None:  # pragma: no cover - console entry point
    status = main()
    if _invoked and set(_invoked) <= EXIT_AT_ONCE:
        # Only our own code ran, it wrote nothing but stdout and stderr, and it left nothing to finalize (pools
        # shut down and temp folders removed by then): what is printed is flushed, and the interpreter's teardown
        # (freeing every module and array one by one: ~1% of a small trace's analyze) is skipped.
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can be said on it
            pass
        os._exit(status)
    if _invoked and set(_invoked) <= FREEZE_AT_EXIT:
        gc.freeze()
    sys.exit(status)
