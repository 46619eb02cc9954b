"""Limits on what an input may hold (one environment variable raises them all)."""

from __future__ import annotations

import contextlib
import gzip
import io
import itertools
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from stepscope.errors import InputError

LIMIT_ENV = "STEPSCOPE_MAX_INPUT_BYTES"
DEFAULT_MAX_INPUT_BYTES = 1 << 30  # seen: 3,699 entries with Python stacks took 0.4 MiB
DEFAULT_MAX_TRACE_BYTES = 16 << 30  # a trace's JSON text; traces are read in pieces, not held whole


def max_input_bytes(default: int = DEFAULT_MAX_INPUT_BYTES) -> int:
    """The most bytes an input may hold, compressed or not: `STEPSCOPE_MAX_INPUT_BYTES`, else `default`
    (1 GiB for memory files, which are decoded whole; DEFAULT_MAX_TRACE_BYTES for traces)."""
    text = os.environ.get(LIMIT_ENV, "")
    return int(text) if text.isdigit() and int(text) > 0 else default


MAX_EVENTS_ENV = "STEPSCOPE_MAX_EVENTS"
DEFAULT_MAX_EVENTS = 1 << 28  # events of one file: about 16 GB of columns
MAX_NAME_CHARS = 1 << 20  # one event or category name (kernel names run to a few thousand characters)


def max_events() -> int:
    """The most events one trace file may hold: `STEPSCOPE_MAX_EVENTS`, else DEFAULT_MAX_EVENTS."""
    text = os.environ.get(MAX_EVENTS_ENV, "")
    return int(text) if text.isdigit() and int(text) > 0 else DEFAULT_MAX_EVENTS


MAX_EVENT_BYTES_ENV = "STEPSCOPE_MAX_EVENT_BYTES"
DEFAULT_MAX_EVENT_BYTES = 256 << 20  # one event's JSON, strings included (real ones: a few KB)
MAX_GZIP_RATIO_ENV = "STEPSCOPE_MAX_GZIP_RATIO"
DEFAULT_MAX_GZIP_RATIO = 200  # text per compressed byte; real traces: 10-30 (ours 13-28), deflate's cap ~1032
GZIP_RATIO_FREE_BYTES = 128 << 20  # text inflated before the ratio is judged (small files may compress well)


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name, "")
    return int(text) if text.isdigit() and int(text) > 0 else default


def max_event_bytes() -> int:
    """The longest one event may be (`STEPSCOPE_MAX_EVENT_BYTES`, else 256 MiB): a string of gigabytes ends
    in an error once this much text holds no end of an event."""
    return _env_int(MAX_EVENT_BYTES_ENV, DEFAULT_MAX_EVENT_BYTES)


def max_gzip_ratio() -> int:
    """How many times its compressed size a gzip trace may inflate to (`STEPSCOPE_MAX_GZIP_RATIO`, else 200)."""
    return _env_int(MAX_GZIP_RATIO_ENV, DEFAULT_MAX_GZIP_RATIO)


def gzip_bomb_problem(ratio: int) -> str:
    return (
        f"gzip data inflates to more than {ratio} times its compressed size (a gzip bomb? real traces inflate "
        f"10-30 times; {MAX_GZIP_RATIO_ENV} raises the limit)"
    )


def gunzip_bounded(path: str | Path, data: bytes, limit: int, *, ratio: int | None = None) -> bytes:
    """Inflate gzip `data` (every member; zero padding after the last is allowed), or raise InputError naming
    `path`: truncated, corrupt (CRC included), or inflating past `limit` bytes (or past `ratio` times its
    size, once GZIP_RATIO_FREE_BYTES are out)."""
    by_ratio = max(ratio * len(data), GZIP_RATIO_FREE_BYTES) if ratio else limit
    most = min(limit, by_ratio)
    out = io.BytesIO()  # (its getvalue() hands over its buffer: no second copy of the text)
    total = 0
    with _gzip_errors(path), gzip.GzipFile(fileobj=io.BytesIO(data)) as fh:
        # Block by block: read(n) would ask for n bytes up front (a MemoryError under an address-space limit).
        while total <= most and (block := fh.read(min(_GUNZIP_BLOCK, most + 1 - total))):
            out.write(block)
            total += len(block)
    if total > by_ratio and by_ratio < limit:
        raise InputError(path, gzip_bomb_problem(ratio or 0))
    if total > limit:
        raise InputError(
            path, f"gzip data inflates to more than {limit} bytes (the limit; {LIMIT_ENV} raises it)"
        )
    return out.getvalue()


class GzipDamaged(Exception):
    """Gzip data that does not inflate: corrupt (a bad CRC included), truncated, or bytes after the last member
    that are not another (`str()`: zlib's words, where it has them)."""


class GzipTruncated(GzipDamaged):
    """Gzip data that ends inside a member."""


class TextOverLimit(Exception):
    """Gzip data that inflates to more than the limit."""


class GzipBomb(Exception):
    """Gzip data that inflates to more than the ratio limit allows."""


def _inflate_module() -> ModuleType:
    """ISA-L's zlib-compatible module (python-isal) where it is installed: it inflates about 3x faster than
    zlib, CRC check included. zlib otherwise (platforms without isal wheels)."""
    try:
        from isal import isal_zlib
    except ImportError:
        return zlib
    return isal_zlib  # type: ignore[no-any-return]


INFLATE = _inflate_module()


def inflated(
    pieces: Iterator[bytes], limit: int, piece_bytes: int, *, ratio: int = 0, module: ModuleType = INFLATE
) -> Iterator[bytes]:
    """The text of gzip data given in pieces, inflated at most `piece_bytes` at a time (never a buffer sized by
    a guess): every member, one after the other (pigz and bgzip write several); zero bytes between or after
    members are padding, as the gzip module reads them. The one gzip inflater of the readers.

    Raises GzipDamaged; TextOverLimit past `limit` bytes of text; with a `ratio`, GzipBomb once the text is
    more than `ratio` times the compressed bytes read (judged every GZIP_RATIO_FREE_BYTES of text).
    `module`: INFLATE (ISA-L's isal_zlib where installed), or zlib."""
    inflate = module.decompressobj(wbits=31)
    error = module.error
    total = 0
    fed = 0  # compressed bytes taken from `pieces`
    next_ratio_check = GZIP_RATIO_FREE_BYTES
    for data in itertools.chain(pieces, [b""]):  # (the empty piece: members that began in the last piece)
        fed += len(data)
        while data or inflate.eof:
            if inflate.eof:  # another member, or padding
                data = (inflate.unused_data + data).lstrip(b"\0")
                if not data:
                    break
                inflate = module.decompressobj(wbits=31)
            try:
                out = inflate.decompress(data, piece_bytes)
            except error as exc:
                raise GzipDamaged(str(exc)) from None
            # At a member's end everything after it is in unused_data; zlib may leave the same bytes in
            # unconsumed_tail too (a call cut short by max_length), and taking both fed the next member twice
            data = b"" if inflate.eof else inflate.unconsumed_tail
            total += len(out)
            if total > limit:
                raise TextOverLimit
            if ratio and total > next_ratio_check:
                next_ratio_check += GZIP_RATIO_FREE_BYTES
                if total > ratio * max(fed - len(data), 1):
                    raise GzipBomb
            if out:
                yield out
    if not inflate.eof:
        raise GzipTruncated


def inflate_pieces(
    path: str | Path, pieces: Iterator[bytes], limit: int, piece_bytes: int
) -> Iterator[bytes]:
    """`inflated` with its errors said as InputError naming `path`: truncated, corrupt, more than `limit` bytes,
    or more than max_gzip_ratio() times its compressed size (a gzip bomb)."""
    ratio = max_gzip_ratio()
    with inflate_errors(path, limit, ratio):
        yield from inflated(pieces, limit, piece_bytes, ratio=ratio)


@contextlib.contextmanager
def inflate_errors(path: str | Path, limit: int, ratio: int) -> Iterator[None]:
    """`inflated`'s errors as InputError naming `path`: truncated, corrupt, more than `limit` bytes, or more than
    `ratio` times its compressed size (a gzip bomb)."""
    try:
        yield
    except GzipBomb:
        raise InputError(path, gzip_bomb_problem(ratio)) from None
    except GzipTruncated:
        raise InputError(path, "truncated gzip file") from None
    except GzipDamaged as exc:
        raise InputError(path, f"corrupt gzip data ({exc})") from None
    except TextOverLimit:
        raise InputError(
            path, f"gzip data inflates to more than {limit} bytes (the limit; {LIMIT_ENV} raises it)"
        ) from None


_GUNZIP_BLOCK = 1 << 20


@contextlib.contextmanager
def _gzip_errors(path: str | Path) -> Iterator[None]:
    """The gzip module's errors as InputError naming `path`."""
    try:
        yield
    except EOFError:
        raise InputError(path, "truncated gzip file") from None
    except (OSError, zlib.error) as exc:
        problem = "CRC check failed" if str(exc).startswith("CRC check failed") else str(exc)
        raise InputError(path, f"corrupt gzip data ({problem})") from None


def gzip_damage_first(path: str | Path, limit: int) -> None:
    """Raise what is wrong with the gzip data of `path`, if anything: a JSON error found in a gzip file's text may
    be damage the streaming inflater had not reached yet (a byte changed inside a member inflates to other
    text, and the member's CRC is checked only at its end). Nothing for a plain file or whole gzip data."""
    with open(path, "rb") as fh:
        if fh.read(2) != b"\x1f\x8b":
            return
    total = 0
    with _gzip_errors(path), gzip.open(path, "rb") as fh:
        while total <= limit and (block := fh.read(_GUNZIP_BLOCK)):
            total += len(block)


def gzip_problem(path: str | Path, limit: int) -> InputError:
    """What is wrong with a gzip file that a streaming inflate stopped on, said as gunzip_bounded says it: the
    file is inflated again by the gzip module, block by block, nothing kept, up to `limit` bytes."""
    total = 0
    with _gzip_errors(path), gzip.open(path, "rb") as fh:
        while total <= limit and (block := fh.read(_GUNZIP_BLOCK)):
            total += len(block)
    return InputError(path, "corrupt gzip data")
