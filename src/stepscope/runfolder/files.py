"""Open run-folder files without ever waiting on what is not a regular file.

A FIFO put where metrics.jsonl or config.yaml was makes a plain `open` wait forever (for a reader, or a
writer); a device such as /dev/zero reads without end. Every run-folder file is opened here: non-blocking, then
checked to be a regular file, so that such a file is one OSError at once, never a hang.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_NOCTTY = getattr(os, "O_NOCTTY", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_BINARY = getattr(os, "O_BINARY", 0)  # Windows: no newline translation


class NotRegularFileError(OSError):
    """A run-folder path that is a FIFO, a device, a socket, a folder or (for writers) a symbolic link."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(errno.EINVAL, "not a regular file", str(path))


def open_regular(path: str | Path, flags: int, mode: int = 0o644, *, follow: bool = True) -> int:
    """`os.open(path, flags)` that returns only a descriptor of a regular file, at once: a FIFO or a device
    raises NotRegularFileError instead of blocking. `follow=False` refuses a symbolic link too (writers)."""
    extra = _NONBLOCK | _NOCTTY | _BINARY | (0 if follow else _NOFOLLOW)
    try:
        fd = os.open(path, flags | extra, mode)
    except OSError as exc:
        # ENXIO: a FIFO opened for writing without a reader; ELOOP: a symbolic link under O_NOFOLLOW
        if exc.errno in (errno.ENXIO, errno.ELOOP, errno.EISDIR):
            raise NotRegularFileError(path) from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFileError(path)
        _set_blocking(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _set_blocking(fd: int) -> None:
    # a regular file ignores O_NONBLOCK; cleared all the same so that the descriptor is an ordinary one
    with contextlib.suppress(AttributeError, OSError):
        os.set_blocking(fd, True)


def read_regular(path: str | Path, limit: int) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; OSError when it is not one, FileTooLargeError
    when it holds more."""
    fd = open_regular(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise FileTooLargeError(path, limit)
    return data


class FileTooLargeError(OSError):
    def __init__(self, path: str | Path, limit: int) -> None:
        super().__init__(errno.EFBIG, f"larger than {limit} bytes", str(path))


def append_regular(path: str | Path, data: bytes) -> None:
    """Append `data` to a regular file (created if missing) in one write: lines of several writers never
    interleave mid-line. A FIFO, a device or a symbolic link there raises NotRegularFileError at once."""
    fd = open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, follow=False)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
