"""The run folder's lock: one writer of the manifest at a time, across the processes (and hosts) of a job.

Where the folder itself can be locked (fcntl's flock on POSIX), the lock is on the folder, so no lock file is
ever left in it, and the kernel releases it when its holder dies. Elsewhere it is `filelock`'s on
`.manifest.lock`: msvcrt on Windows and an exclusively created file where there is no OS lock at all (both
remove the file on release), and flock on that file where a filesystem cannot flock a folder (NFS emulates flock
with POSIX locks, which need a file open for writing; there the file stays, as removing a lock file others may
hold splits them across two files).
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stepscope.runfolder.layout import LOCK_NAME

LOCK_TIMEOUT_S = 60.0
# Descriptors of run folders this process holds or waits to flock. A process forked meanwhile (a DataLoader worker
# forked by the training thread while a writer's thread holds the lock) closes its copies at once: an flock
# belongs to the open file, so a child that kept a copy would hold the lock for as long as it lives.
_open_fds: set[int] = set()


def _close_in_child() -> None:
    for fd in list(_open_fds):
        with contextlib.suppress(OSError):
            os.close(fd)  # (never LOCK_UN: that would release the parent's lock)
    _open_fds.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)

# flock's answers for "held by another process" (EACCES on some filesystems, as filelock also reads it)
_HELD = frozenset({errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES})
# ... and for "this filesystem cannot flock a folder": the same on every process of the job, so all of them
# fall back to the same lock file
_UNSUPPORTED = frozenset({errno.EBADF, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EISDIR})


@contextlib.contextmanager
def folder_lock(run_dir: Path, timeout: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold the run folder's lock for the block; TimeoutError when another process holds it for `timeout` s."""
    fd = _lock_folder(run_dir, timeout)
    if fd is None:
        import filelock

        with filelock.FileLock(run_dir / LOCK_NAME, timeout=timeout):
            yield
        return
    try:
        yield
    finally:
        _open_fds.discard(fd)
        os.close(fd)  # closing the last descriptor releases the flock


def _lock_folder(run_dir: Path, timeout: float) -> int | None:
    """A descriptor of `run_dir` holding its flock, or None where the folder cannot be flocked."""
    fcntl = _fcntl()
    if fcntl is None:
        return None
    try:
        fd = os.open(run_dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as exc:
        if exc.errno in _UNSUPPORTED:
            return None
        raise
    _open_fds.add(fd)
    deadline = time.monotonic() + timeout
    pause = 0.002
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError as exc:
            if exc.errno not in _HELD:
                _open_fds.discard(fd)
                os.close(fd)
                if exc.errno in _UNSUPPORTED:
                    return None
                raise
        if time.monotonic() >= deadline:
            _open_fds.discard(fd)
            os.close(fd)
            raise TimeoutError(f"{run_dir}: another process held the run folder's lock for {timeout:g} s")
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def _fcntl() -> Any:
    try:
        import fcntl
    except ImportError:  # Windows
        return None
    return fcntl if hasattr(fcntl, "flock") else None
