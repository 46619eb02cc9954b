"""The user's cache folder and what its entries are keyed by: the kept tables (`tables.py` here) and the kept
results of commands (`cli/_output.py`). Nothing here imports numpy: a command answered from the cache never
loads it.

The folder: STEPSCOPE_CACHE_DIR, else $XDG_CACHE_HOME/stepscope, else ~/.cache/stepscope. STEPSCOPE_NO_CACHE=1
(`--no-cache`) turns every kept thing off; STEPSCOPE_CACHE_MAX_MB (default 2048) bounds the kept tables, a
quarter of it the kept results, the least recently used going first.

A file is known by its absolute path, size, modification time and a hash of its first and last 64 KiB: a file
written again gets a new key where its size or time changed, or where they were put back but its head or tail
differs (an edit inside its middle, its size and time put back by hand, is not seen). A folder is known by every
file under it, in linked sub-folders too (at most `MAX_FILES`), and the code that answers by stepscope's own files
(in a checkout; an installed wheel by its record of files) and the versions of what it reads with. The
STEPSCOPE_ variables (the input limits among them) are part of every key but the cache's own.
"""

from __future__ import annotations

import contextlib
import functools
import os
import stat
import sys
from pathlib import Path
from typing import Any

try:  # (the same hash as hashlib's, without loading OpenSSL: 5-25 ms of a command answered from the cache)
    from _blake2 import blake2b
except ImportError:  # pragma: no cover - a Python without the built-in module
    from hashlib import blake2b

from stepscope._version import __version__

NO_CACHE_ENV = "STEPSCOPE_NO_CACHE"
MAX_ENV = "STEPSCOPE_CACHE_MAX_MB"
DIR_ENV = "STEPSCOPE_CACHE_DIR"
DEFAULT_MAX_MB = 2048
EDGE = 64 << 10  # bytes of a file's head and tail hashed into its key
MAX_FILES = 256  # a folder of more files is not fingerprinted (its results are not kept; its tables are)


# the variables that change where and whether things are kept, not what they hold
ENV_SKIPPED = frozenset({DIR_ENV, NO_CACHE_ENV, MAX_ENV, "STEPSCOPE_PROGRESS"})


def kept_env() -> list[tuple[str, str]]:
    """The STEPSCOPE_ variables that may change a table or an answer (the input limits, say), sorted."""
    return sorted(
        (k, v) for k, v in os.environ.items() if k.startswith("STEPSCOPE_") and k not in ENV_SKIPPED
    )


def enabled() -> bool:
    return os.environ.get(NO_CACHE_ENV, "").strip().lower() not in ("1", "true", "yes")


def base() -> Path:
    """The user's cache folder for stepscope (tables, results, compiled templates)."""
    configured = os.environ.get(DIR_ENV)
    if configured:
        return Path(configured)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "stepscope"


def max_bytes() -> int:
    """The bound of the kept tables (STEPSCOPE_CACHE_MAX_MB)."""
    try:
        return max(int(float(os.environ.get(MAX_ENV, DEFAULT_MAX_MB)) * (1 << 20)), 0)
    except ValueError:
        return DEFAULT_MAX_MB << 20


def evict(where: Path, most: int, suffix: str) -> None:
    """Remove the least recently used files of `where` ending in `suffix` until they hold at most `most`
    bytes."""
    entries = []
    for entry in os.scandir(where):
        if entry.name.endswith(suffix) and entry.is_file(follow_symlinks=False):
            st = entry.stat(follow_symlinks=False)
            entries.append((st.st_mtime_ns, st.st_size, entry.path))
    total = sum(size for _, size, _ in entries)
    for _, size, path in sorted(entries):
        if total <= most:
            break
        with contextlib.suppress(OSError):
            os.unlink(path)
            total -= size


def hash_file(digest: Any, path: Path | str, st: os.stat_result) -> None:
    """Add the file at `path` (its stat `st`) to `digest`: size, modification time, head and tail."""
    digest.update(f"{st.st_size}|{st.st_mtime_ns}|".encode())
    with open(path, "rb") as fh:
        digest.update(fh.read(EDGE))
        if st.st_size > EDGE:
            fh.seek(max(st.st_size - EDGE, EDGE))
            digest.update(fh.read(EDGE))


def input_key(path: Path | str, exclude: Path | str | None = None) -> str | None:
    """The key of a trace file or of a folder (every file under it but `exclude`); None when it cannot be read
    whole, is or holds something that is not a regular file (a FIFO, a device), or the folder holds more than
    MAX_FILES files."""
    digest = blake2b(digest_size=20)
    try:
        root = Path(path).resolve()
        st = root.stat()
        digest.update(f"{root}|".encode())
        if not stat.S_ISDIR(st.st_mode):
            if not stat.S_ISREG(st.st_mode):
                return None  # (a FIFO or a device: opening it to read could wait forever)
            hash_file(digest, root, st)
            return digest.hexdigest()
        left_out = os.path.realpath(exclude) if exclude is not None else None
        files = []
        seen = {os.path.realpath(root)}
        # (linked sub-folders are followed, as the loader follows them; each real folder once: a link to a
        # folder above it is no loop)
        for folder, dirs, names in os.walk(root, followlinks=True):
            dirs[:] = [d for d in sorted(dirs) if _first_visit(os.path.join(folder, d), seen)]
            for name in names:
                file = os.path.join(folder, name)
                if file != left_out:
                    files.append(file)
            if len(files) > MAX_FILES:
                return None
        for name in sorted(files):
            digest.update(f"{os.path.relpath(name, root)}|".encode())
            st = os.stat(name)
            if not stat.S_ISREG(st.st_mode):
                return None
            hash_file(digest, name, st)
    except (OSError, ValueError, RuntimeError):  # (RuntimeError: a loop of symbolic links)
        return None
    return digest.hexdigest()


def _first_visit(folder: str, seen: set[str]) -> bool:
    real = os.path.realpath(folder)
    if real in seen:
        return False
    seen.add(real)
    return True


@functools.cache
def code_key() -> str:
    """The key of the code that answers: stepscope's version and files (an edited checkout is new code), the
    Python and the versions of the libraries an answer is computed with."""
    import importlib.util

    digest = blake2b(digest_size=20)
    digest.update(f"{__version__}|{sys.version}|".encode())
    package = Path(__file__).resolve().parents[3]  # (stepscope/: this file is analysis/read/cache/...)
    record = _installed_record(package)
    if record is not None:  # an installed wheel: its record of files changes with every install
        st = os.stat(record)
        digest.update(f"{record}|{st.st_size}|{st.st_mtime_ns}|".encode())
    else:  # a checkout (an editable install): every file, as it is now
        digest.update("\n".join(package_files(package)).encode())
    for library in ("numpy", "msgspec", "jinja2", "markupsafe", "click", "regex", "yaml"):
        spec = importlib.util.find_spec(library)  # (a top-level package: found, not imported)
        origin = spec.origin if spec is not None else None
        with contextlib.suppress(OSError, TypeError):
            st = os.stat(origin)  # type: ignore[arg-type]
            digest.update(f"{library}|{origin}|{st.st_size}|{st.st_mtime_ns}|".encode())
    return digest.hexdigest()


def package_files(package: Path) -> list[str]:
    """Every file of the package folder but bytecode, each as 'path|size|mtime_ns', sorted."""
    files: list[str] = []
    folders = [str(package)]
    while folders:  # (os.scandir, not os.walk: a few ms of the answer printed from the cache)
        for entry in os.scandir(folders.pop()):
            if entry.is_dir(follow_symlinks=False):
                if entry.name != "__pycache__":
                    folders.append(entry.path)
            elif not entry.name.endswith((".pyc", ".pyo")):
                st = entry.stat()
                files.append(f"{entry.path}|{st.st_size}|{st.st_mtime_ns}")
    return sorted(files)


def _installed_record(package: Path) -> Path | None:
    """The RECORD of the wheel that installed `package` into a site-packages folder, else None."""
    if package.parent.name not in ("site-packages", "dist-packages"):
        return None
    for entry in os.scandir(package.parent):
        if entry.name.startswith(f"{package.name}-") and entry.name.endswith(".dist-info"):
            record = Path(entry.path, "RECORD")
            if record.is_file():
                return record
    return None
