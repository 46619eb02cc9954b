"""The progress bar of long loads: a rich bar on stderr (bytes done, time so far, ETA), drawn from the loader's progress callback, shown only
on a terminal and only once loading turns out to take more than a second."""

from __future__ import annotations

import os
import sys
import time
from typing import Any


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
