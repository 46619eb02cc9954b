"""What capture says to the user while a job runs: warnings that point at the user's own line (and never raise
into a job run with `-W error`), and the console it prints its tables on (stderr, which switches itself off
when it is gone). Only stepscope.units (the escaping of text) is imported here: every part of capture may use it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from pathlib import Path
from typing import Any

from stepscope.units import plain_lines


class StepscopeWarning(UserWarning):
    """Warnings stepscope emits while a job runs (a collector switched off, a short job, ...)."""


_NOT_USER_CODE = tuple(
    str(Path(p).resolve().parent) + os.sep
    for p in (__file__.rsplit(os.sep, 2)[0] + os.sep + "x", os.__file__)  # stepscope, the standard library
)


def warn_user(message: str, category: type[Warning] = StepscopeWarning) -> None:
    """`warnings.warn` pointing at the user's line: the innermost frame outside stepscope, torch and the
    standard library (a warning raised in a profiler callback names the user's `monitor.step()`).

    A job run with `-W error` (or PYTHONWARNINGS=error, or a filter of its own) turns warnings into exceptions;
    stepscope's own must never raise into it, so such a warning is printed as Python prints a warning, once."""
    frame = sys._getframe(1)
    level = 2
    while frame is not None and _internal(frame.f_code.co_filename):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    if frame is None:
        level = 2
    message = plain_lines(message)  # (it may hold a path or a name: it never drives the terminal)
    try:
        warnings.warn(message, category, stacklevel=level)
    except Warning:
        _show_once(message, category, frame)


_shown: set[tuple[str, type[Warning]]] = set()


def _show_once(message: str, category: type[Warning], frame: Any) -> None:
    if (message, category) in _shown:
        return
    _shown.add((message, category))
    filename, lineno = (frame.f_code.co_filename, frame.f_lineno) if frame is not None else ("stepscope", 0)
    with contextlib.suppress(Exception):  # a closed stderr, a showwarning of the job's that fails
        warnings.showwarning(message, category, filename, lineno)


class ConsoleStream:
    """The text stream capture prints on: sys.stderr of the moment, until a write or flush fails (a closed
    pipe, `train.py 2>&1 | head`, a log collector gone); then it says nothing more for the rest of the process.
    A failing console never reaches the job: rich would turn a BrokenPipeError into SystemExit."""

    off = False

    def write(self, text: str) -> int:
        if not ConsoleStream.off:
            try:
                sys.stderr.write(text)
            except Exception:
                ConsoleStream.off = True
        return len(text)

    def flush(self) -> None:
        if not ConsoleStream.off:
            try:
                sys.stderr.flush()
            except Exception:
                ConsoleStream.off = True

    def isatty(self) -> bool:
        try:
            return not ConsoleStream.off and sys.stderr.isatty()
        except Exception:
            return False

    @property
    def encoding(self) -> str:
        return getattr(sys.stderr, "encoding", None) or "utf-8"


def console_write(text: str) -> None:
    """Write `text` on capture's console (stderr), never raising; a control character in it (from a path or a
    name) is written as a visible escape."""
    stream = ConsoleStream()
    stream.write(plain_lines(text))
    stream.flush()


def capture_console() -> Any:
    """The console capture prints its tables on: stderr, always (inside the user's own script as under
    `stepscope run`), so that the script's stdout stays exactly its own and the tables go where its logs go.
    Its stream switches itself off at the first failure (ConsoleStream)."""
    from stepscope.report.terminal import make_console  # (rich: only once capture prints)

    return make_console(file=ConsoleStream())  # type: ignore[arg-type]


def _internal(filename: str) -> bool:
    path = os.path.abspath(filename)
    return (
        path.startswith(_NOT_USER_CODE)
        or f"{os.sep}torch{os.sep}" in path
        or f"{os.sep}click{os.sep}" in path  # `stepscope run`: the command's own frames
        or filename.startswith("<frozen")
    )
