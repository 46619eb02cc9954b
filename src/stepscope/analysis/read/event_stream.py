"""The events of a chrome trace as plain objects, a batch at a time: what `stepscope merge` rewrites.

The loader turns events into columns; merge must write each event back with all its fields, so it needs them
as dicts, but never all of a file's at once (10 million events as dicts took 11.5 GB). The text is inflated
a block at a time (every gzip member), the `traceEvents` array is cut after an event's `}` followed by `,`
and `{`, and each piece is decoded as `[piece]`. A cut inside a string or inside an event leaves that text
unbalanced, so its decode fails and a later cut is tried (each try at least twice as far as the last, so a
long event costs linear time); the piece then holds exactly the events the whole file holds there. The
last piece is decoded with the keys after the array.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import msgspec

from stepscope.analysis.read.limits import (
    DEFAULT_MAX_TRACE_BYTES,
    LIMIT_ENV,
    MAX_EVENT_BYTES_ENV,
    inflate_pieces,
    max_event_bytes,
    max_input_bytes,
)
from stepscope.errors import InputError
from stepscope.runfolder.files import open_regular

__all__ = ["BATCH_BYTES", "EventPieces", "Piece", "iter_event_batches"]

BATCH_BYTES = 1 << 20  # JSON text decoded at a time (its dicts take several times as much)
_READ = 1 << 16
_KEY = re.compile(rb'"traceEvents"[ \t\n\r]*:[ \t\n\r]*\[')
_CUT = re.compile(rb"\}[ \t\n\r]*,[ \t\n\r]*\{")
_DECODE = msgspec.json.Decoder()
_RAW_KEYS = msgspec.json.Decoder(dict[str, msgspec.Raw])  # a document's keys, values left as text


def _text(fh: BinaryIO, path: Path, limit: int) -> Iterator[bytes]:
    """The file's text in blocks: inflated where it is gzip (every member; zero padding after the last)."""
    first = fh.read(_READ)
    if first[:2] != b"\x1f\x8b":
        total = len(first)
        yield first
        while block := fh.read(_READ):
            total += len(block)
            if total > limit:
                raise InputError(
                    path, f"larger than the input limit of {limit} bytes ({LIMIT_ENV} raises it)"
                )
            yield block
        return
    yield from inflate_pieces(
        path, itertools.chain([first], iter(lambda: fh.read(_READ), b"")), limit, _READ * 4
    )


class _Buffer:
    def __init__(self, blocks: Iterator[bytes]) -> None:
        self.blocks = blocks
        self.data = bytearray()
        self.eof = False

    def more(self) -> bool:
        block = next(self.blocks, None)
        if block is None:
            self.eof = True
            return False
        self.data += block
        return True


def iter_event_batches(path: str | Path, *, batch_bytes: int = BATCH_BYTES) -> Iterator[list[Any]]:
    """Lists of the events of the trace at `path` (plain objects, in file order), each from about
    `batch_bytes` of its text; InputError naming the file when it is not a chrome trace that can be read so."""
    for piece in EventPieces(path, batch_bytes=batch_bytes):
        yield piece.events


class Piece(NamedTuple):
    """A run of a trace's events: `text`, the JSON array that holds them, and `events`, that array decoded (by
    the reader's `decoder`; plain objects where `typed` is False: some event does not fit its type)."""

    text: bytes
    events: list[Any]
    typed: bool


class EventPieces:
    """The events of a trace file in pieces of about `batch_bytes` of JSON, in file order (iterate), each
    decoded by `decoder` (a msgspec decoder of a list; plain objects by default); after the last piece,
    `head` and `tail` hold the document's other keys as raw JSON (those before the array, those after it).
    InputError naming the file when it is not a chrome trace that can be read so."""

    def __init__(self, path: str | Path, *, decoder: Any = None, batch_bytes: int = BATCH_BYTES) -> None:
        self.path = Path(path)
        self.decoder = decoder or _DECODE
        self.batch_bytes = batch_bytes
        self.head: dict[str, msgspec.Raw] = {}
        self.tail: dict[str, msgspec.Raw] = {}

    def __iter__(self) -> Iterator[Piece]:
        p, batch_bytes = self.path, self.batch_bytes
        limit = max_input_bytes(DEFAULT_MAX_TRACE_BYTES)
        longest = max_event_bytes()
        with open_regular(p, "a trace file") as fh:
            buf = _Buffer(_text(fh, p, limit))
            start = _array_start(buf, p, self.head)
            at = start + batch_bytes
            while True:
                end = len(buf.data)
                m = _CUT.search(buf.data, max(at, start), end)
                if m is None:
                    if end - start > batch_bytes + longest:
                        raise InputError(
                            p,
                            f"no end of an event in {longest} bytes ({MAX_EVENT_BYTES_ENV} raises the limit)",
                        )
                    # Searched up to `end`: only a cut that begins at the last `}` can still complete with the
                    # next block (a cut holds no other `}`), so the search goes on from there, not from `at`
                    # again (a long string without a cut was searched anew at every block: quadratic)
                    last = buf.data.rfind(b"}", max(at, start), end)
                    at = end if last < 0 else last
                    if buf.more():
                        continue
                    break
                piece = self._decode(b"[" + bytes(buf.data[start : m.start() + 1]) + b"]")
                if piece is None:  # the cut lies inside an event or a string: try one at least twice as far
                    at = max(m.end(), start + 2 * (m.start() + 1 - start))
                    continue
                yield piece
                del buf.data[: m.end() - 1]  # keep the next event's `{`
                start, at = 0, batch_bytes
            yield self._tail(bytes(buf.data[start:]))

    def _decode(self, text: bytes) -> Piece | None:
        """`text` decoded; None when it is not JSON (a cut inside an event)."""
        try:
            return Piece(text, self.decoder.decode(text), True)
        except msgspec.ValidationError:
            pass  # valid JSON or not, an event of another shape: decoded plainly, which tells
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
            return None
        try:
            events = _DECODE.decode(text)
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
            return None
        return Piece(text, events, False) if isinstance(events, list) else None

    def _tail(self, rest: bytes) -> Piece:
        """The last events: `rest` is the end of the array and the keys after it."""
        p = self.path
        if _KEY.search(rest):
            raise InputError(p, "a second traceEvents array: cannot be merged")
        try:
            doc = _RAW_KEYS.decode(b'{"traceEvents":[' + rest)
            array = doc.pop("traceEvents", None)
            piece = None if array is None else self._decode(bytes(array))
            if piece is None and array is not None:
                _DECODE.decode(array)  # says what is wrong
        except msgspec.DecodeError as exc:
            raise InputError(p, f"not valid JSON ({exc})") from None
        except UnicodeDecodeError:
            raise InputError(p, "not valid JSON (bad UTF-8)") from None
        except RecursionError:
            raise InputError(p, "JSON nested too deeply") from None
        if piece is None or not isinstance(piece.events, list):
            raise InputError(p, "no traceEvents list")
        self.tail = doc
        return piece


def _array_start(buf: _Buffer, path: Path, keys: dict[str, msgspec.Raw]) -> int:
    """The offset just after the `[` of the top-level `traceEvents` array (the keys before it checked and put
    into `keys`, raw)."""
    searched = 0
    while True:
        m = _KEY.search(buf.data, searched)
        if m is None:
            searched = max(len(buf.data) - 64, 0)
            if len(buf.data) > max_event_bytes():
                raise InputError(path, "no traceEvents array found: not a chrome trace")
            if not buf.more():
                raise InputError(path, "no traceEvents array found: not a chrome trace")
            continue
        try:
            head = _RAW_KEYS.decode(bytes(buf.data[: m.end()]).lstrip(b"\xef\xbb\xbf") + b"]}")
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError):
            head = None
        if head is not None and bytes(head.get("traceEvents", b"")) == b"[]":
            del head["traceEvents"]
            keys.update(head)
            return m.end()
        searched = m.start() + 1  # the key text inside a string of an earlier key
