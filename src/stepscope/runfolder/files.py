"""Opening run-folder files without ever waiting on what is not a regular file, and reading them in bounded
amounts.

A FIFO put where metrics.jsonl or config.yaml was makes a plain `open` wait forever (for a reader, or a
writer); a device such as /dev/zero reads without end; a sparse file of terabytes would be read whole.
Writers open through `open_regular_fd` / `append_regular` (an OSError at once, never a hang); readers of a
run folder's small artifacts (the manifest, metrics.jsonl, trigger, claim and listener files, flops, comm,
memory and system records, config.yaml) and of memory snapshots, in analysis and capture alike, through
`open_regular` / `read_regular`: one InputError naming the file, before anything is read.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from stepscope.errors import InputError

_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_NOCTTY = getattr(os, "O_NOCTTY", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_BINARY = getattr(os, "O_BINARY", 0)  # Windows: no newline translation


class NotRegularFileError(OSError):
    """A run-folder path that is a FIFO, a device, a socket, a folder or (for writers) a symbolic link."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(errno.EINVAL, "not a regular file", str(path))


def open_regular_fd(path: str | Path, flags: int, mode: int = 0o644, *, follow: bool = True) -> int:
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


def append_regular(path: str | Path, data: bytes) -> None:
    """Append `data` to a regular file (created if missing) in one write: lines of several writers never
    interleave mid-line. A FIFO, a device or a symbolic link there raises NotRegularFileError at once."""
    fd = open_regular_fd(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, follow=False)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


# --- readers ---------------------------------------------------------------------------------------
SMALL_FILE_BYTES = 64 << 20  # a manifest, metrics.jsonl, a trigger file: real ones are KB to a few MB
_PIECE = 1 << 20

# O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, forever. (Reads of a regular file
# ignore it.) O_NOCTTY: a terminal device named here never becomes this process's controlling terminal.
_FLAGS = os.O_RDONLY | _NONBLOCK | _NOCTTY | _BINARY


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a file"


def open_regular(path: str | Path, what: str, *, limit: int | None = None) -> BinaryIO:
    """`path` open for reading in binary, when it is a regular file (a symlink to one is fine) of at most
    `limit` bytes; InputError naming it otherwise: '<path>: a FIFO, expected <what>'."""
    try:
        fd = os.open(path, _FLAGS)
    except IsADirectoryError:
        raise InputError(path, f"a folder, expected {what}") from None
    except FileNotFoundError:
        raise InputError(path, "no such file") from None
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise InputError(path, f"a folder, expected {what}")
        if not stat.S_ISREG(info.st_mode):
            raise InputError(path, f"not a regular file ({_kind(info.st_mode)}), expected {what}")
        if limit is not None and info.st_size > limit:
            raise InputError(path, f"{info.st_size} bytes, over the limit of {limit} for {what}")
        if _FLAGS & getattr(os, "O_NONBLOCK", 0):  # (POSIX only) reads of the regular file block as usual
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | Path, what: str, *, limit: int = SMALL_FILE_BYTES) -> bytes:
    """All the bytes of a regular file of at most `limit` bytes (one that grew past it while read included);
    InputError naming the file otherwise."""
    with open_regular(path, what, limit=limit) as fh:
        try:
            data = fh.read(min(os.fstat(fh.fileno()).st_size, limit) + 1)
            while len(data) <= limit and (more := fh.read(min(_PIECE, limit + 1 - len(data)))):
                data += more
        except OSError as exc:
            raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise InputError(path, f"over the limit of {limit} bytes for {what}")
    return data


def read_regular_text(path: str | Path, what: str, *, limit: int = SMALL_FILE_BYTES) -> str:
    """The UTF-8 text of a regular file of at most `limit` bytes (a byte order mark dropped); InputError naming
    the file when it is not one, or not UTF-8."""
    data = read_regular(path, what, limit=limit)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(path, f"not UTF-8 text (byte {exc.start})") from None


def iter_pieces(fh: BinaryIO, path: str | Path, limit: int) -> Iterator[bytes]:
    """The bytes of an open file in pieces of at most 1 MiB; InputError once more than `limit` came."""
    total = 0
    while True:
        try:
            piece = fh.read(_PIECE)
        except OSError as exc:
            raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
        if not piece:
            return
        total += len(piece)
        if total > limit:
            raise InputError(path, f"over the limit of {limit} bytes")
        yield piece
