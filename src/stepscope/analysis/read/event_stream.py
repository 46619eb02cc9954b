"""The events of a chrome trace as plain objects (or a reader's own Structs), a piece at a time: what `stepscope
merge` rewrites, what its alignment and `stepscope ops` select from.

The loader turns events into columns; merge must write each event back with all its fields, so it needs them
as dicts, but never all of a file's at once (10 million events as dicts took 11.5 GB). The text and its
`traceEvents` array cut into pieces of whole events are the loader's own (_text.TraceText, _text.EventArray):
each piece is decoded as `[piece]`, the keys before the array and after it are kept as raw JSON.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import msgspec

from stepscope.analysis.read._text import (
    EventArray,
    NoArray,
    NotBetweenEvents,
    PieceTooLong,
    TooLong,
    TraceText,
    error_byte,
    json_problem,
    shifted_bytes,
    too_long_problem,
)
from stepscope.analysis.read.limits import (
    DEFAULT_MAX_TRACE_BYTES,
    LIMIT_ENV,
    GzipDamaged,
    gzip_damage_first,
    gzip_problem,
    inflate_errors,
    max_event_bytes,
    max_input_bytes,
)
from stepscope.errors import InputError
from stepscope.runfolder.files import open_regular

__all__ = ["BATCH_BYTES", "EventPieces", "Piece", "iter_event_batches"]

# JSON text decoded at a time: the objects of a small piece are made and freed within the CPU's caches. Plain
# objects of a 200 MB trace (891,808 events), best of 3: 64 KB 0.66 s, 128 KB 0.76 s, 1 MB 1.15 s
BATCH_BYTES = 1 << 16
_TAIL_PREFIX = b'{"traceEvents":['
_BOM = b"\xef\xbb\xbf"  # a UTF-8 byte order mark
_DECODE = msgspec.json.Decoder()
_RAW_KEYS = msgspec.json.Decoder(dict[str, msgspec.Raw])  # a document's keys, values left as text


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
        self._array: EventArray | None = None  # (while iterating: where a piece lies in the file)

    def __iter__(self) -> Iterator[Piece]:
        p = self.path
        limit = max_input_bytes(DEFAULT_MAX_TRACE_BYTES)
        with open_regular(p, "a trace file") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > limit:
                raise InputError(p, f"larger than the input limit of {limit} bytes ({LIMIT_ENV} raises it)")
            text = TraceText(fh, size, limit)  # type: ignore[arg-type]
            array = EventArray(text, self.batch_bytes)
            with _text_problems(p, limit, text):
                try:
                    array.find_array(lambda at: self._head(array.buf[:at]))
                except NoArray:
                    raise InputError(p, "no traceEvents array found: not a chrome trace") from None
                self._array = array
                yield from array.pieces(self._decode)
                origin = array.dropped + array.pos - len(_TAIL_PREFIX)
                yield self._tail(array.rest(array.max_event + array.chunk_bytes), origin)

    def _head(self, text: bytearray) -> bool:
        """The keys before the array (the text up to its `[`, closed by `]}`), or False: the key was spelled
        inside a string of an earlier key."""
        try:
            head = _RAW_KEYS.decode(bytes(text).removeprefix(_BOM) + b"]}")
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError):
            return False
        if bytes(head.get("traceEvents", b"")) != b"[]":
            return False
        del head["traceEvents"]
        self.head.update(head)
        return True

    def _decode(self, view: memoryview) -> Piece:
        """A piece (`[` ... `]`) decoded; NotBetweenEvents when its text is not whole events (a cut inside an
        event or a string), InputError for an error of the file's own before the cut."""
        text = bytes(view)
        try:
            return Piece(text, self.decoder.decode(text), True)
        except msgspec.ValidationError:
            pass  # valid JSON or not, an event of another shape: decoded plainly, which tells
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
            pass
        try:
            events = _DECODE.decode(text)
        except msgspec.DecodeError as exc:
            message = str(exc)
            byte = error_byte(message)
            if byte is not None and byte < len(text) - 1 and "trailing characters" not in message:
                # before the `]` put at the cut: the file's own text in its own context
                raise InputError(
                    self.path,
                    json_problem(shifted_bytes(message, self._array.piece_origin if self._array else 0)),
                ) from None
            raise NotBetweenEvents from None
        except (UnicodeDecodeError, RecursionError):
            raise NotBetweenEvents from None
        if not isinstance(events, list):
            raise NotBetweenEvents
        return Piece(text, events, False)

    def _tail(self, rest: bytes, origin: int) -> Piece:
        """The last events: `rest` is the end of the array and the keys after it (`origin`: where the text
        decoded here, `{"traceEvents":[` + rest, would begin in the file)."""
        p = self.path
        text = _TAIL_PREFIX + rest
        try:
            doc = _RAW_KEYS.decode(text)
            array = doc.pop("traceEvents", None)
            # a second top-level traceEvents key is the one JSON keeps: its array is not the one read so far (a
            # key of that name inside another key's value is no matter)
            at = len(_TAIL_PREFIX) - 1
            if array is not None and text[at : at + len(array)] != bytes(array):
                raise InputError(p, "a second traceEvents array: cannot be merged")
            piece = None if array is None else self._plain(bytes(array))
        except msgspec.DecodeError as exc:
            raise InputError(p, json_problem(shifted_bytes(str(exc), origin))) from None
        except UnicodeDecodeError:
            raise InputError(p, "not valid JSON (bad UTF-8)") from None
        except RecursionError:
            raise InputError(p, "JSON nested too deeply") from None
        if piece is None or not isinstance(piece.events, list):
            raise InputError(p, "no traceEvents list")
        self.tail = doc
        return piece

    def _plain(self, text: bytes) -> Piece:
        """The array `text` by the reader's decoder, else as plain objects (an event of another shape)."""
        try:
            return Piece(text, self.decoder.decode(text), True)
        except msgspec.ValidationError:
            return Piece(text, _DECODE.decode(text), False)


@contextlib.contextmanager
def _text_problems(path: Path, limit: int, text: TraceText) -> Iterator[None]:
    """The text's errors (the inflater's, a piece past the event limit) as InputError naming `path`, in the
    loader's words; a JSON error of a gzip file whose data is damaged further on is said as that damage."""
    with inflate_errors(path, limit, text.ratio):
        try:
            yield
        except (PieceTooLong, TooLong) as exc:
            raise InputError(path, too_long_problem(exc, max_event_bytes())) from None
        except GzipDamaged:  # (said in the loader's words: the gzip module's, inflating the file again)
            raise gzip_problem(path, limit) from None
        except InputError as exc:
            if exc.problem.startswith(("not valid JSON", "truncated JSON")):
                gzip_damage_first(path, limit)
            raise
