"""Read memory files from unknown sources without running anything they contain.

Pickles are read by `_plain_pickle`, which builds only plain containers and scalars (dict, list, tuple, set,
str, bytes, int, float, bool, None), refuses every global, and counts what it builds against a budget (bytes
of objects and opcodes, from the input limit). Gzip is recognised by its magic bytes and inflated a piece at
a time, JSON by its first character; its size once decoded is estimated before it is decoded.

Every answer is bounded: only regular files are read, up to `max_input_bytes()` before and after gunzip; what
they build stays within `object_budget()`; and where a pickle reaches a container twice, the objects counted
as the tree a reader walks (shared references count each time, so a small pickle whose lists repeat one
another cannot expand into billions of objects later) stop at `MAX_OBJECTS` and `MAX_DEPTH`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import msgspec

from stepscope.analysis.memory._plain_pickle import PickleRefused, RefusedGlobal, load_plain_pickle
from stepscope.analysis.read.limits import LIMIT_ENV, inflate_pieces, max_input_bytes
from stepscope.errors import InputError
from stepscope.runfolder.files import iter_pieces, open_regular

_GZIP_MAGIC = b"\x1f\x8b"
MAX_OBJECTS = 20_000_000  # containers and scalars, counted as a tree
MAX_DEPTH = 200  # snapshots and timelines nest a handful of levels
_JSON_CONTAINER = 88  # bytes of an empty list or dict, with its slot
_INFLATE_PIECE = 1 << 20
_SUM_PIECE = 1 << 20
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

    total = 0.0
    for part in parts:
        flat = np.asarray(part).reshape(-1)
        for at in range(0, len(flat), _SUM_PIECE):  # float copies of a piece at a time, not of the whole
            total += float(np.abs(flat[at : at + _SUM_PIECE].astype(np.float64)).sum())
    if total >= BIG:
        raise InputError(source, f"{what} add up past 2**62 bytes: not a real memory record")


def object_budget(limit: int) -> tuple[int, int]:
    """The estimated bytes of objects and the pickle opcodes a memory file may cost, for an input limit of
    `limit` bytes: half of it (at least 64 MiB), and one opcode per 32 bytes (at least 4 million; for the
    default 1 GiB, 33.5 million: under 20 s of reading on a busy core)."""
    return max(limit // 2, 64 << 20), max(limit // 32, 4_000_000)


def read_untrusted(path: str | Path) -> Any:
    """Decode a pickle or JSON file (optionally gzip'd) into plain Python objects, or raise InputError."""
    path = Path(path)
    limit = max_input_bytes()
    with open_regular(path, "a memory snapshot file", limit=limit) as fh:
        pieces = iter_pieces(fh, path, limit)
        first = next(pieces, b"")
        if first.startswith(_GZIP_MAGIC):
            pieces = _inflated(path, itertools.chain([first], pieces), limit)
            first = next(pieces, b"")
        while first and not first.strip():  # whitespace only so far: dropped (JSON allows it), never held
            first = next(pieces, b"")
        if not first.strip():
            raise InputError(path, "empty file")
        if first.lstrip()[:1] in (b"[", b"{"):
            return _decode_json(path, _joined(path, first, pieces, limit), limit)
        return _unpickle(path, itertools.chain([first], pieces), limit)


def _joined(path: Path, first: bytes, pieces: Iterator[bytes], limit: int) -> bytes:
    parts, total = [first], len(first)
    for piece in pieces:
        parts.append(piece)
        total += len(piece)
        if total > limit:
            raise InputError(path, f"over the limit of {limit} bytes ({LIMIT_ENV} raises it)")
    return b"".join(parts)


def _inflated(path: Path, pieces: Iterator[bytes], limit: int) -> Iterator[bytes]:
    return inflate_pieces(path, pieces, limit, _INFLATE_PIECE)


def _decode_json(path: Path, raw: bytes, limit: int) -> Any:
    """JSON decoded whole, after its size once decoded is estimated from its brackets and length (a JSON text
    never shares a value, so the estimate is the tree readers walk)."""
    max_bytes, _ = object_budget(limit)
    containers = raw.count(b"[") + raw.count(b"{")  # brackets inside strings count too: an upper bound
    if containers > MAX_OBJECTS or _JSON_CONTAINER * containers + 2 * len(raw) > max_bytes:
        raise InputError(
            path,
            f"its objects would take more than {max_bytes >> 20} MiB of memory ({LIMIT_ENV} raises the limit)",
        )
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        # (msgspec 0.23 says a string that is not UTF-8 so, where 0.22 raised UnicodeDecodeError)
        why = "not UTF-8 text" if "UTF-8" in str(exc) else str(exc)
        raise InputError(path, f"invalid JSON: {why}") from None
    except RecursionError:
        raise InputError(path, "JSON nested too deeply") from None
    except UnicodeDecodeError:
        raise InputError(path, "invalid JSON: not UTF-8 text") from None


def _unpickle(path: Path, pieces: Iterator[bytes], limit: int) -> Any:
    max_bytes, max_ops = object_budget(limit)
    try:
        obj, shared = load_plain_pickle(pieces, max_bytes=max_bytes, max_ops=max_ops)
    except RefusedGlobal as exc:
        raise InputError(path, f"unsafe pickle rejected ({exc})") from None
    except PickleRefused as exc:
        raise InputError(path, f"not loaded: {exc}") from None
    if shared:  # a container reached twice: count the tree its readers will walk
        check_shape(obj, path)
    return obj


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
