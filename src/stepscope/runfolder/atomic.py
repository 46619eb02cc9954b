"""Write files so that a reader never sees half of one: write a temp file beside it, then rename."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

# mkstemp creates files 0600; published files get the usual 0666 & ~umask (read once, at import).
_UMASK = os.umask(0o022)
os.umask(_UMASK)
FILE_MODE = 0o666 & ~_UMASK  # what a published file gets


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write `data` to `path` atomically (same-folder temp file + os.replace)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # (not tempfile.mkstemp: tempfile imports random, hashlib and OpenSSL, 5-15 ms of a page written from the cache)
    while True:
        tmp = path.parent / f".{path.name}.{os.urandom(6).hex()}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
            break
        except FileExistsError:  # pragma: no cover - 48 random bits taken
            continue
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def create_exclusive(path: str | Path, data: bytes) -> bool:
    """Write `data` to `path` only if no such file exists, all at once (a temp file, then a hard link: a reader
    never sees it half-written, and of several writers exactly one wins). False when the file already existed."""
    path = Path(path)
    tmp = temp_path_beside(path)
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def temp_path_beside(path: str | Path) -> Path:
    """A fresh temp file name in the same folder as `path`, for writers that need a path (os.replace it after)."""
    import tempfile

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        prefix=f".{path.name}.", suffix=".tmp" + "".join(path.suffixes), dir=path.parent
    )
    try:
        # writers that reopen the path keep its mode: give it the published one now (mkstemp's is 0600)
        os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)
    return Path(tmp)
