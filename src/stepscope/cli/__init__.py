"""The `stepscope` command. Subcommands live one per module in this package and are imported lazily,
so `stepscope --help` does not pay for numpy, torch or the analyzers. This is the only place where errors
become messages and exit codes."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from stepscope.errors import StepscopeError
from stepscope.units import plain

if TYPE_CHECKING:
    import click

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
    "ops": ("ops", "Each op's FLOPs, bytes and efficiency against the device's roofline (record_shapes)."),
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
# numpy's OpenBLAS starts a thread per CPU when numpy is imported, unless one of these says how many: the analyses
# never call BLAS, and on 2 busy cores those threads' start and spin cost ~50 ms of a 0.2 s analyze. Set for the
# analysis commands only (`_group.py`), and taken back by `main`.
BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
ANALYSIS_COMMANDS = frozenset({"summary", "analyze", "whatif", "diff", "report", "merge", "memory", "ops"})
# Commands that print and write nothing else, and leave nothing to finalize (their pools shut down and their temp
# folders removed by then): their process ends without the interpreter's teardown, which frees every module and
# array one by one (5-7% of a whole `analyze`, `summary` or `whatif --json` of a 15 MB trace, measured paired with
# and without it).
EXIT_AT_ONCE = frozenset({"analyze", "summary", "whatif"})
# the commands whose `--json` answer a command line seen before may give at once (analysis/read/cache/answers.py),
# and `report`, whose page it may write again
AT_ONCE_COMMANDS = frozenset({"analyze", "summary", "whatif", "ops", "diff"})
_env_set: list[str] = []  # variables set for the command that runs (main takes them back)
_env_saved: dict[str, str | None] = {}  # what such a variable held before (None: it was not set)
_commands: list[str] = []  # the subcommand that ran (_group.py)
_line: list[str] = []  # the command line (the arguments after `stepscope`)


def __getattr__(name: str) -> Any:
    """`cli`, the click group, imported on first use."""
    if name == "cli":
        from stepscope.cli._group import cli

        return cli
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def limit_blas_threads() -> None:
    if not any(var in os.environ for var in BLAS_THREAD_VARS):
        os.environ[BLAS_THREAD_VARS[0]] = "1"  # (for this command only: main takes it back)
        _env_set.append(BLAS_THREAD_VARS[0])


def command_line() -> list[str]:
    """The arguments after `stepscope` of the command that runs."""
    return list(_line)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 2 bad input or usage). Every failure is one line on stderr,
    its text from files and arguments escaped (`plain`): a name never drives the terminal."""
    _stand_in_for_closed_streams()
    _line[:] = list(argv) if argv is not None else sys.argv[1:]
    answered = _answer_at_once(_line)
    if answered is not None:
        _line.clear()
        return answered
    try:
        from stepscope.cli._group import cli

        result = cli.main(
            args=list(argv) if argv is not None else None, prog_name="stepscope", standalone_mode=False
        )
    except StepscopeError as exc:
        return _error(str(exc), exc.exit_code)
    except BrokenPipeError:
        return 0
    except SystemExit as exc:
        # click ends a command whose write met a reader that went away (`analyze --json | head -1`: EPIPE) with
        # SystemExit(1) and nothing said; the reader took what it wanted: 0, as the console's commands end
        if exc.code == 1 and _reader_gone():
            return 0
        raise
    except OSError as exc:  # a file or folder the command met on its way (a folder without search permission)
        where = f"{exc.filename}: " if exc.filename is not None else ""
        return _error(f"{where}{exc.strerror or exc}", 2)
    except RecursionError:  # a reader of nested input that has no depth limit of its own
        return _error("the input is nested too deeply to be read", 2)
    except OverflowError as exc:
        return _error(f"a number in the input is out of range ({exc})", 2)
    except Exception:  # (click's exceptions: none is one of the above)
        return _click_failure()
    finally:
        while _env_set:
            name = _env_set.pop()
            before = _env_saved.pop(name, None)
            if before is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = before
        _line.clear()  # (a command run by other means than main has no command line to key)
    return result if isinstance(result, int) else 0


def answered_at_once(line: Sequence[str]) -> bool:
    """Whether the same command line again may be answered from what it gave before: a `--json` answer, or the
    page of `report` (not opened in a browser)."""
    if not line:
        return False
    if line[0] == "report":
        return "--open" not in line
    return line[0] in AT_ONCE_COMMANDS and "--json" in line


def note_line(note: object) -> str:
    """A note as the commands print it on stderr."""
    return f"stepscope: note: {plain(note)}\n"


def written_line(target: object, size: int) -> str:
    """What `report` says once its page is written."""
    return f"report: {plain(target)}  ({size / 1e6:.2f} MB)"


def _answer_at_once(line: list[str]) -> int | None:
    """The exit status of a command line answered by what the same line gave before (cli/_output.py: the same
    inputs, code and settings), before click or any command's module is imported; None when it is not."""
    if not answered_at_once(line):
        return None
    from stepscope.analysis.read.cache import answers

    try:
        found = answers.line_answer(line)
    except Exception:  # (a cache that cannot be read is no reason to fail: the command runs)
        return None
    if found is None:
        return None
    _, kept, target = found
    _commands.append(line[0])
    try:
        if target is None:
            answers.replay(kept)
        else:  # report: its notes, its page written again, its line, as the command does them
            from stepscope.cli._output import page_again

            answers.replay(answers.Kept(stderr="".join(note_line(n) for n in kept.notes)))
            size = page_again(kept, target)
            sys.stdout.write(written_line(target, size) + "\n")
            sys.stdout.flush()
    except StepscopeError as exc:  # (a page that cannot be written: said as main says it)
        return _error(str(exc), exc.exit_code)
    except BrokenPipeError:  # (as main ends: 0 where stdout's reader went away, 1 where stderr's did)
        return 0 if _reader_gone() else 1
    except OSError as exc:  # (a full disk behind stdout: said as main says it)
        return _error(f"{exc.strerror or exc}", 2)
    return kept.code


def _reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it."""
    import select

    try:
        poll = select.poll()
        poll.register(1, select.POLLOUT)
        return any(events & select.POLLERR for _, events in poll.poll(0))
    except (OSError, ValueError, AttributeError):  # (no poll on this platform, or no fd 1)
        return False


def _stand_in_for_closed_streams() -> None:
    """A command started with stdout or stderr closed (`stepscope analyze RUN >&-`: Python sets the stream to
    None) writes what it would print there to the null device: the files it writes (a report, a merged trace)
    are still written, and nothing ends in a traceback."""
    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w", encoding="utf-8"))  # noqa: SIM115 (the process's own)


def _click_failure() -> int:
    """The exception being handled, when it is one of click's: its message and exit status; else raised on."""
    import click

    exc = sys.exc_info()[1]
    if isinstance(exc, click.exceptions.Abort):
        click.echo("stepscope: aborted", err=True)
        return 130
    if isinstance(exc, click.exceptions.NoArgsIsHelpError):  # `stepscope` alone: the help
        exc.show()
        return exc.exit_code
    if isinstance(exc, click.ClickException):
        return _usage_error(exc)
    raise  # (the exception main is handling)


def _error(message: str, status: int) -> int:
    with contextlib.suppress(OSError, ValueError):  # (a closed or full stderr: the status still says it)
        sys.stderr.write(f"stepscope: error: {plain(message)}\n")
        sys.stderr.flush()
    return status


def _usage_error(exc: click.ClickException) -> int:
    """A usage error in one line (click's own is three or four): the command, the problem, where help is."""
    import click

    ctx = getattr(exc, "ctx", None)
    command = ctx.command_path if ctx is not None else "stepscope"
    hint = f" (see '{command} --help')" if ctx is not None else ""
    click.echo(f"{command}: error: {plain(exc.format_message())}{hint}", err=True)
    return exc.exit_code


def run() -> None:  # pragma: no cover - console entry point
    status = main()
    if _commands and set(_commands) <= EXIT_AT_ONCE:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can be said on it
            pass
        os._exit(status)
    sys.exit(status)
