"""Stopping torch's profiler on the thread that started it, when that thread ends or the process exits.

torch's profiler must be stopped on the thread that started it: stopped from another thread, or never stopped
before the interpreter exits, it crashes the process (SIGSEGV). A monitor stepped from several threads records
on the thread that started it (monitor.py); if that thread ends with a window open, or the monitor is closed
on another thread, nothing else can stop that window safely. Two places can:
- the thread's own end: CPython clears a thread's `threading.local` data on that thread as it ends, so an
  object kept there is finalized there (`ThreadExitGuard`);
- the process's exit, where `atexit` runs on the main thread: when the main thread is the one that records
  (trace.py registers that).
What is stopped there is dropped, not exported (the monitor says so when it closes).
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable

_local = threading.local()


class ThreadExitGuard:
    """Kept in a thread-local of the recording thread: calls each registered stop function on that thread as
    it ends (for collectors still alive)."""

    def __init__(self) -> None:
        self._stops: weakref.WeakKeyDictionary[object, Callable[[], None]] = weakref.WeakKeyDictionary()

    def __del__(self) -> None:
        for stop in list(self._stops.values()):
            with contextlib.suppress(Exception):
                stop()

    def add(self, owner: object, stop: Callable[[], None]) -> None:
        self._stops[owner] = stop


def stop_at_thread_exit(owner: object, stop: Callable[[], None]) -> None:
    """Have `stop` called on this thread when it ends (as long as `owner` lives; `stop` must not hold it)."""
    guard = getattr(_local, "guard", None)
    if guard is None:
        guard = _local.guard = ThreadExitGuard()
    guard.add(owner, stop)
