"""Opening files that someone else may have replaced: only regular files, read in bounded amounts.

A run folder's small artifacts (the manifest, metrics.jsonl, trigger, claim and listener files, flops, comm,
memory and system records, config.yaml) and memory snapshots are read through here, by analysis and capture
alike. A FIFO in their place would make a plain
`open()` wait for a writer forever, `/dev/zero` would never end, a sparse file of terabytes would be read
whole: each is refused with one line naming the file (InputError), before anything is read.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from stepscope.errors import InputError

__all__ = ["SMALL_FILE_BYTES", "iter_pieces", "open_regular", "read_regular", "read_regular_text"]

SMALL_FILE_BYTES = 64 << 20  # a manifest, metrics.jsonl, a trigger file: real ones are KB to a few MB
_PIECE = 1 << 20

# O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, forever. (Reads of a regular file
# ignore it.) O_NOCTTY: a terminal device named here never becomes this process's controlling terminal.
_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_BINARY", 0)


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
