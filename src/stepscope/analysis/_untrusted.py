"""Read memory files from unknown sources without running anything they contain.

A pickle can name any importable callable and have it called on load; `_PlainUnpickler` refuses every global,
so only the containers and scalars pickle builds by itself (dict, list, tuple, str, bytes, int, float, bool,
None) ever come out. Gzip is recognised by its magic bytes, JSON by its first character.

Every answer is bounded: only regular files are read, up to `max_input_bytes()` before and after gunzip, and the
decoded objects, counted as the tree a reader walks (shared references count each time, so a small pickle whose
lists repeat one another cannot expand into billions of objects later), stop at `MAX_OBJECTS` and `MAX_DEPTH`.
"""

from __future__ import annotations

import io
import os
import pickle
import stat
from pathlib import Path
from typing import Annotated, Any

import msgspec

from stepscope.analysis._limits import LIMIT_ENV, gunzip_bounded, max_input_bytes
from stepscope.errors import InputError

_GZIP_MAGIC = b"\x1f\x8b"
MAX_OBJECTS = 20_000_000  # containers and scalars, counted as a tree
MAX_DEPTH = 200  # snapshots and timelines nest a handful of levels
# Integers of memory files: byte counts and times fit int64 with room for their sums; past that, a file is
# refused rather than read into wrong (wrapped) numbers.
BIG = 1 << 62
Int62 = Annotated[int, msgspec.Meta(ge=-BIG, le=BIG)]
Bytes62 = Annotated[int, msgspec.Meta(ge=0, le=BIG)]
FiniteTime = Annotated[float, msgspec.Meta(ge=-1e18, le=1e18)]  # NaN and infinities fail these bounds


def check_total(source: str | Path, what: str, *parts: Any) -> None:
    """InputError when the absolute values of `parts` (arrays or numbers) add up past 2**62: their running
    sums would wrap."""
    import numpy as np

    total = sum(float(np.abs(np.asarray(part, dtype=np.float64)).sum()) for part in parts)
    if total >= BIG:
        raise InputError(source, f"{what} add up past 2**62 bytes: not a real memory record")


class RefusedGlobal(pickle.UnpicklingError):
    """The pickle asked for a class or function: never loaded, the file is rejected."""


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise RefusedGlobal(
            f"refused to load {module}.{name}: only plain containers and scalars are accepted"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise RefusedGlobal("refused a persistent id: only plain containers and scalars are accepted")


def load_plain_pickle(data: bytes) -> Any:
    """Unpickle bytes admitting only plain containers and scalars; any global or persistent id raises."""
    return _PlainUnpickler(io.BytesIO(data)).load()


def read_untrusted(path: str | Path) -> Any:
    """Decode a pickle or JSON file (optionally gzip'd) into plain Python objects, or raise InputError."""
    path = Path(path)
    limit = max_input_bytes()
    raw = _read_regular(path, limit)
    if raw.startswith(_GZIP_MAGIC):
        raw = gunzip_bounded(path, raw, limit)
    if not raw.strip():
        raise InputError(path, "empty file")
    if raw.lstrip()[:1] in (b"[", b"{"):
        try:
            obj = msgspec.json.decode(raw)
        except msgspec.DecodeError as exc:
            raise InputError(path, f"invalid JSON: {exc}") from None
        except RecursionError:
            raise InputError(path, "JSON nested too deeply") from None
        except UnicodeDecodeError:
            raise InputError(path, "invalid JSON: not UTF-8 text") from None
    else:
        obj = _unpickle(path, raw)
    del raw
    check_shape(obj, path)
    return obj


def _read_regular(path: Path, limit: int) -> bytes:
    """The bytes of a regular file of at most `limit` bytes (never a FIFO, a device or a folder)."""
    try:
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, forever.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
        with os.fdopen(fd, "rb") as fh:
            info = os.fstat(fh.fileno())
            if not stat.S_ISREG(info.st_mode):
                kind = "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file"
                raise InputError(path, f"{kind}, expected a memory snapshot file")
            if info.st_size > limit:
                raise InputError(
                    path, f"{info.st_size} bytes, over the limit of {limit} ({LIMIT_ENV} raises it)"
                )
            data = fh.read(limit + 1)
            if len(data) > limit:  # it grew since fstat
                raise InputError(path, f"over the limit of {limit} bytes ({LIMIT_ENV} raises it)")
            return data
    except IsADirectoryError:
        raise InputError(path, "a folder, expected a memory snapshot file") from None
    except FileNotFoundError:
        raise InputError(path, "no such file") from None
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None


def _unpickle(path: Path, raw: bytes) -> Any:
    try:
        return load_plain_pickle(raw)
    except RefusedGlobal as exc:
        raise InputError(path, f"unsafe pickle rejected ({exc})") from None
    except RecursionError:
        raise InputError(path, "pickle nested too deeply") from None
    except MemoryError:
        raise InputError(path, "pickle too large to load in this machine's memory") from None
    # Anything else a hostile or damaged byte stream makes the unpickler raise is still just bad input.
    except Exception as exc:
        raise InputError(path, f"not a readable pickle or JSON file ({type(exc).__name__}: {exc})") from None


def check_shape(
    obj: Any, source: str | Path, max_objects: int = MAX_OBJECTS, max_depth: int = MAX_DEPTH
) -> None:
    """InputError when `obj`, counted as the tree readers will walk (a shared list counts at each of its
    places), holds more than `max_objects` nodes or more than `max_depth` levels, or contains itself.

    Each distinct container is visited once (sizes are added up through shared references), so a small pickle
    whose lists repeat one another is measured without expanding it."""
    if _children(obj) is None:
        return
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    open_: set[int] = set()
    stack: list[tuple[Any, bool]] = [(obj, False)]
    while stack:
        item, children_done = stack.pop()
        key = id(item)
        kids = _children(item)
        if not children_done:
            if key in size:
                continue
            if key in open_:
                raise InputError(source, "a container holds itself (a cycle): not a memory snapshot")
            open_.add(key)
            stack.append((item, True))
            stack.extend((c, False) for c in kids if _children(c) is not None and id(c) not in size)
            continue
        open_.discard(key)
        total, deepest = 1, 0
        for c in kids:
            ck = id(c)
            total += size.get(ck, 1)
            deepest = max(deepest, depth.get(ck, 0))
        size[key], depth[key] = total, deepest + 1
        if total > max_objects:
            raise InputError(
                source, f"holds more than {max_objects} objects once its shared references are expanded"
            )
        if depth[key] > max_depth:
            raise InputError(source, f"nested deeper than {max_depth} levels")


def _children(item: Any) -> Any:
    if isinstance(item, dict):
        return item.values()
    if isinstance(item, (list, tuple)):
        return item
    return None
