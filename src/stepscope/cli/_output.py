"""What a command writes: the files a user names, the answers kept for the next same command, and the progress
bar of long loads (a rich bar on stderr: bytes done, time so far, ETA; shown only on a terminal and only once
loading turns out to take more than a second).

**Files** (report, report --compare, merge, memory --html): one check and one way of writing for all of them. Only
a regular file is ever replaced, and only by a rename of a complete temp file written beside it: a reader never
sees half a page, and what was there stays whole when the write fails. A symbolic link is refused, whether it
points to a file or nowhere: writing through it would change a file elsewhere, and renaming over it would silently
turn the link into a file. A device, a FIFO or a folder is refused too (a rename would replace /dev/null with a
plain file).

**Kept answers** (issue 48, item 5): `analyze --json`, `summary --json`, `whatif --json`, `diff --json` and `report`
print or write what they did the last time, without loading anything, when nothing they read has changed. An answer is
keyed by the command and all its options as given, the working folder, every input (each file's path, size, time
and the hash of its head and tail: `analysis.read.cache.input_key`), the code that made it (stepscope's files,
Python, the libraries' versions) and every STEPSCOPE_ variable but the cache's own. What is kept: the bytes
printed on stdout, the notes printed on stderr and, for `report`, the page. An answer that cannot be keyed (an
input that is gone, a folder of more than 256 files), a command that fails, or an answer over a sixteenth of the
results' bound (32 MiB by default) is not kept; `--no-cache` (STEPSCOPE_NO_CACHE=1) neither reads nor keeps one.
The entries are files under `results/` in the user's cache folder (their format: analysis/read/cache/answers.py),
written through a temp file and a rename, evicted least recently used first within a quarter of
STEPSCOPE_CACHE_MAX_MB; one that does not read back is removed and the command runs. The same command line again,
its inputs unchanged, is answered before click is imported (`keep_line`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import stat
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from stepscope.analysis.read import cache
from stepscope.analysis.read.cache import answers
from stepscope.errors import InputError


def output_target(path: Path, what: str) -> Path:
    """`path` when `what` (e.g. "the report") may be written there: nothing there yet, or a regular file. Anything
    else is an InputError naming the path, one line."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return path
    except OSError as exc:
        raise InputError(path, f"cannot write {what} ({exc.strerror or exc})") from None
    if stat.S_ISLNK(mode):
        raise InputError(
            path, f"a symbolic link: {what} is never written through a link (choose another name)"
        )
    if not stat.S_ISREG(mode):
        raise InputError(
            path, f"not a regular file: {what} replaces only a regular file (choose another name)"
        )
    return path


def write_output(path: Path, data: str | bytes, what: str) -> Path:
    """Write `data` (text is UTF-8) to `path` through a temp file and a rename, after `output_target`'s check; a
    failure (no such folder, no permission, a full disk) is an InputError naming the path."""
    from stepscope.runfolder.atomic import atomic_write_bytes

    output_target(path, what)
    try:
        return atomic_write_bytes(path, data.encode("utf-8") if isinstance(data, str) else data)
    except OSError as exc:
        raise InputError(path, f"cannot write {what} ({exc.strerror or exc})") from None


Kept = answers.Kept


class Keyed(NamedTuple):
    """An answer's key (None when it cannot be keyed) and the inputs it was keyed by, as they were then."""

    name: str | None
    inputs: list[answers.Input]


def answer_key(
    command: str, inputs: Sequence[Path | str], exclude: Path | None = None, **params: Any
) -> Keyed:
    """The key of `command` with `params` (the options as given, encodable by msgspec) over `inputs` (a folder's
    file `exclude` left out: the page a command writes into it); no key when the cache is off or an input cannot
    be keyed."""
    if not cache.enabled():
        return Keyed(None, [])
    read = []
    for path in inputs:
        one = cache.input_key(path, exclude)
        if one is None:
            return Keyed(None, [])
        read.append(answers.Input(str(path), None if exclude is None else str(exclude), one))
    import msgspec  # (here: a page written again from a command line seen before needs none of it)

    keys = [i.key for i in read]
    try:
        text = msgspec.json.encode(
            [command, os.getcwd(), keys, cache.kept_env(), cache.code_key(), params],
            enc_hook=str,
            order="sorted",
        )
    except (OSError, TypeError, msgspec.EncodeError):
        return Keyed(None, [])
    return Keyed(cache.blake2b(text, digest_size=20).hexdigest(), read)


def kept_answer(name: str | None) -> Kept | None:
    """The answer kept under `name` (a key), else None."""
    return answers.read(name)


def keep_answer(name: str | None, kept: Kept) -> None:
    """Keep `kept` under `name` (nothing when `name` is None, or the answer is too big); never fails."""
    answers.write(name, kept)


class Recording:
    """What print_json and print_notes print while a command runs under `recording`."""

    def __init__(self, most: int) -> None:
        self.kept = Kept()
        self.parts: list[bytes] = []
        self.left = most  # bytes that may still be recorded; below 0: too big to keep
        self.printed = False  # whether the answer's first bytes went out

    def err(self, text: str) -> None:
        """Lines the command printed on stderr: before its answer or after it, as they came."""
        if self.printed:
            self.kept.stderr_after += text
        else:
            self.kept.stderr += text

    def add(self, data: bytes) -> None:
        self.printed = True
        self.left -= len(data)
        if self.left >= 0:
            self.parts.append(data)
        else:
            self.parts.clear()


_current: Recording | None = None


def recording_now() -> Recording | None:
    return _current


@contextlib.contextmanager
def recording(name: str | None) -> Iterator[Recording | None]:
    """Record what the command prints in its block and keep it under `name` when the block ends without an
    exception (nothing when `name` is None)."""
    global _current
    if name is None:
        yield None
        return
    record = Recording(answers.largest())
    _current = record
    try:
        yield record
    finally:
        _current = None
    if record.left >= 0:
        record.kept.stdout = b"".join(record.parts)
        keep_answer(name, record.kept)


_STAMPED = (
    ("generated</dt><dd>", "</dd>"),
    ("Made by stepscope on ", "."),
)  # where a page says when it was made


def page_now(kept: Kept) -> bytes:
    """A kept page, saying it was written now (the time in its header and footer), in one copy of its bytes."""
    page = kept.page or b""
    if not kept.generated:
        return page
    import time

    old, new = kept.generated, time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    places = []
    for before, after in _STAMPED:
        at = page.find(f"{before}{old}{after}".encode())
        if at >= 0:
            places.append(at + len(before.encode()))
    view, parts, start = memoryview(page), [], 0
    for at in sorted(places):
        parts.append(view[start:at])
        start = at + len(old.encode())
    parts.append(view[start:])
    return new.encode().join(parts)


replay_answer = answers.replay


def kept_json(
    command: str, inputs: tuple[str, ...] = ("path",)
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a command's callback whose `--json` answer is kept: with `as_json`, the answer kept for the same
    options (all but `wide`) and inputs (the parameters named in `inputs`) is printed again and its exit code
    returned, else the command runs and its answer (and the code it returns) is kept."""

    def decorate(callback: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(callback)
        def run(**params: Any) -> Any:
            if not params.get("as_json"):
                return callback(**params)
            paths = [params[name] for name in inputs]
            keyed = answer_key(command, paths, **{k: v for k, v in params.items() if k != "wide"})
            kept = kept_answer(keyed.name)
            if kept is not None:
                replay_answer(kept)
                keep_line(keyed)
                return kept.code or None
            with recording(keyed.name) as record:
                code = callback(**params)
                if record is not None:
                    record.kept.code = code if isinstance(code, int) else 0
            keep_line(keyed)
            return code

        return run

    return decorate


def keep_line(keyed: Keyed, write: Path | None = None) -> None:
    """Note that this process's command line gave the answer kept under `keyed` (`write`: where it wrote its
    page): the same line again, its inputs unchanged, is answered before click is imported (cli/__init__.py,
    analysis/read/cache/answers.py)."""
    from stepscope import cli

    line = cli.command_line()
    if cli.answered_at_once(line):
        with contextlib.suppress(Exception):  # (never a reason to fail a command)
            answers.keep_line(line, keyed.name, keyed.inputs, write)


def page_again(kept: Kept, target: Path) -> int:
    """Write a kept page to `target` again, saying it is written now; its size."""
    page = page_now(kept)
    write_output(target, page, "the report")
    return len(page)


class ProgressBar:
    """`with ProgressBar() as bar: load_trace(path, progress=bar)`; `enabled` True forces it, False hides it."""

    DELAY_S = 1.0

    def __init__(self, *, enabled: bool | None = None) -> None:
        self.enabled = enabled
        self._bar: Any = None
        self._task: Any = None
        self._started = 0.0

    def __enter__(self) -> ProgressBar:
        self._started = time.perf_counter()
        return self

    def __call__(self, done: int, total: int, label: str) -> None:
        if self._bar is None:
            if self.enabled is False or time.perf_counter() - self._started <= self.DELAY_S:
                return
            self._show(total)
            if self._bar is None:
                return
        from rich.markup import escape  # (rich is imported once the bar shows)

        from stepscope.units import plain

        # the file's name is text: never markup (a `[/]` in it raised, a `[link=...]` made a link), never controls
        description = escape(plain(f"loading {label}".rstrip()))
        self._bar.update(self._task, completed=done, total=total, description=description)

    def _show(self, total: int) -> None:
        forced = os.environ.get("FORCE_COLOR") or os.environ.get("TTY_COMPATIBLE")
        if self.enabled is None and not (forced or sys.stderr.isatty()):
            self.enabled = False  # not a terminal: known without importing rich (25 ms)
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        console = Console(stderr=True)
        if self.enabled is None and not console.is_terminal:
            self.enabled = False
            return
        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
            transient=True,
        )
        self._bar.start()
        self._task = self._bar.add_task("loading traces", total=total)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
