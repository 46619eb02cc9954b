"""Read one trace file in chunks: streaming gunzip, the `traceEvents` array cut between events, columns
built chunk by chunk (the per-file half of the loader; see loader.py).

Neither the whole decompressed text nor all the event Structs are ever held at once: the text is inflated
block by block (_text: limits.inflated, by ISA-L's zlib-compatible module or zlib's), and the array is decoded
a piece of about `CHUNK_BYTES` at a time,
whose Structs are turned into columns and freed before the next piece is read.

Where to cut: after an event's closing brace, at a `}` `,` `{` (whitespace allowed). Such a spot may also
lie inside an event (an array of objects in its args) or inside a string; the piece is then not a complete
list of events, and decoding `[` + piece + `]` fails (unbalanced brackets, or an unterminated string), so the
next spot is tried. A piece that decodes is exactly the events the whole-file decoder would have read there,
because the piece starts where an event starts and JSON is read the same way in either context. The text
before the array (header keys) is decoded on its own, with `]}` appended; the last piece is decoded with the
rest of the file (`{"traceEvents":[` prepended), header keys after the array included.

An error found in a piece is the file's own when the parser stops before the `]` put after the piece (a field
of the wrong type, a character JSON does not allow there): it is reported as the whole-file decoder reports it,
its event and byte counted in the whole file. A truncated file, a second document after the first, damaged gzip
data are found in the last piece or by the inflater; a second `traceEvents` key in the last piece drops the
events read before it, as JSON keeps a key's last value. Several gzip members are inflated one after the other,
and a UTF-8 byte order mark is skipped. What the scheme still cannot vouch for (a `traceEvents` key inside an
object before the real one) goes to the whole-file decoder in _decode when its text is within the event limit
(a whole decode holds about 3 times the text), and is refused past it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from stepscope.analysis.read._columns import ColumnBuilder
from stepscope.analysis.read._decode import (
    BOM,
    DECODERS,
    EPOCH_FLOAT_TS,
    HEAD_DECODER,
    HEADER_FIELDS,
    SNIFF_BYTES,
    UNSET,
    add_events,
    exact_ts_of_array,
    exact_ts_of_trace,
    gc_paused,
    load_whole,
    read_header,
    shapes_of_array,
    shapes_of_trace,
    wrong_type_problem,
)
from stepscope.analysis.read._numparse import NotANumber
from stepscope.analysis.read._parts import FileTable
from stepscope.analysis.read._text import (
    READ_BYTES,
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
    MAX_EVENT_BYTES_ENV,
    GzipBomb,
    GzipDamaged,
    TextOverLimit,
    gzip_bomb_problem,
    gzip_damage_first,
    gzip_problem,
    max_event_bytes,
    max_input_bytes,
)
from stepscope.errors import InputError

__all__ = ["CHUNK_BYTES", "FileTable", "load_file"]

CHUNK_BYTES = 1 << 20  # JSON text decoded at a time (its Structs take about as much memory again). The whole
# load (inflate, decode, columns; CPU time, paired) is 3-7% cheaper with 1 MB than with 256 KB: each piece's
# columns cost some 40 numpy calls whatever its size, and that outweighs the Structs staying in the CPU caches
_MAX_NS = 1 << 62
_KEY = b'"traceEvents"'


def _key_pattern(key: str) -> re.Pattern[bytes]:
    """A JSON object key spelled `key`, any of its characters maybe written as a \\u escape."""

    def char(c: str) -> str:
        escaped = "".join(f"[{d.lower()}{d.upper()}]" if d.isalpha() else d for d in f"{ord(c):04x}")
        return f"(?:{re.escape(c)}|\\\\u{escaped})"

    return re.compile(('"' + "".join(map(char, key)) + '"[ \t\n\r]*:').encode())


# In the rest of the file, a second `traceEvents` key would replace the array read so far.
_ANOTHER_KEY = _key_pattern("traceEvents")
_TAIL_PREFIX = b'{"traceEvents":['


class _RawTail(msgspec.Struct):
    traceEvents: msgspec.Raw  # the text of the key's last value


_RAW_TAIL = msgspec.json.Decoder(_RawTail)


class _Fallback(Exception):
    """The chunked reader cannot vouch for this file: decode it whole (within the event limit; see load_file)."""

    def __init__(self, reason: str = "it cannot be read in pieces") -> None:
        super().__init__(reason)
        self.reason = reason


class _BadJSON(Exception):
    """A piece of text did not decode; `message` is msgspec's (its `(byte N)` counted in the piece)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def load_file(
    path: str | Path,
    rank_hint: int | None = None,
    progress: Callable[[float], None] | None = None,
    *,
    chunk_bytes: int | None = None,
    flows: bool = True,
) -> FileTable:
    """Decode one trace file into columns with local symbol tables (the unit of work of the pool).

    `progress(fraction)` is called as the file is read. `chunk_bytes`: JSON text decoded at a time
    (default CHUNK_BYTES). `flows`: keep the flow events ('s', 'f': arrows in a viewer, which no analysis
    reads). Raises InputError naming the file and the problem."""
    report = progress or (lambda fraction: None)
    p = Path(path)
    report(0.0)
    table: FileTable | None = None
    reason = ""
    try:
        with gc_paused():
            try:
                table = _load_chunked(p, rank_hint, report, chunk_bytes or CHUNK_BYTES, flows)
            except _Fallback as exc:
                reason = exc.reason
            if table is None:  # outside the except block: the failed attempt's buffers are already freed
                # Decoding whole takes about 3 times the text: only a file within the event limit is.
                table = load_whole(p, rank_hint, flows=flows, most=max_event_bytes(), why=reason)
    except RecursionError:
        raise InputError(p, "JSON nested too deeply") from None
    _check_times(table, p)
    report(1.0)
    return table


def _check_times(table: FileTable, path: Path) -> None:
    """Times of at most 2**62 ns (the year 2116 since the epoch), so that a start plus a duration never wraps
    int64: larger ones are refused, not turned into wrong windows."""
    for key in ("ts", "dur"):
        column = table.columns.get(key)
        if column is not None and len(column) and max(int(column.max()), -int(column.min())) > _MAX_NS:
            raise InputError(path, f"a {key} beyond 2**62 ns (year 2116 since the epoch): not a real trace")


def _load_chunked(
    path: Path, rank_hint: int | None, report: Callable[[float], None], chunk_bytes: int, flows: bool
) -> FileTable:
    try:
        fh = open(path, "rb")  # noqa: SIM115 (closed below; errors are reported by the whole-file path)
    except OSError:
        raise _Fallback from None
    with fh:
        size = path.stat().st_size
        limit = max_input_bytes(DEFAULT_MAX_TRACE_BYTES)
        if size > limit:
            raise InputError(path, f"larger than the input limit of {limit} bytes ({LIMIT_ENV} raises it)")
        reader = _ChunkReader(path, TraceText(fh, size, limit), chunk_bytes, flows)
        try:
            reader.run(report)
        except GzipDamaged:
            raise gzip_problem(path, limit) from None
        except _BadJSON as exc:
            gzip_damage_first(path, limit)
            raise InputError(path, json_problem(exc.message)) from None
        except TextOverLimit:
            raise InputError(
                path, f"gzip data inflates to more than {limit} bytes (the limit; {LIMIT_ENV} raises it)"
            ) from None
        except GzipBomb:
            raise InputError(path, gzip_bomb_problem(reader.text.ratio)) from None
        except (PieceTooLong, TooLong) as exc:
            raise InputError(path, too_long_problem(exc, reader.max_event)) from None
        return reader.builder.finish(rank_hint)


class _ChunkReader:
    """Adds each piece of whole events of the array (_text.EventArray) to the builder."""

    def __init__(
        self,
        path: Path,
        text: TraceText,
        chunk_bytes: int,
        flows: bool = True,
        *,
        first: bool = True,
        last: bool = True,
        spill: Path | None = None,
    ) -> None:
        """`first` / `last`: the text is a stretch of the events array (see _split) that holds its start (the
        header keys before it) / its end (the header keys after it); a stretch that is not first begins
        with an event's `{`, one that is not last ends with an event's `}`."""
        self.first, self.last = first, last
        self.head: Any = None
        self.tail_header: dict[str, Any] = {}  # header keys after the array, those present
        self.text: TraceText = text
        self.array = EventArray(text, chunk_bytes)
        self.builder = ColumnBuilder(path, flows=flows, spill=spill)
        self.strict = True
        self.strict_failures = 0
        self.text_ts = False
        self.max_event = self.array.max_event
        # Reading the whole file (not a stretch of it): an error found in a piece is the file's own, said here
        # as the whole-file decoder says it.
        self.whole = first and last

    def run(self, report: Callable[[float], None]) -> None:
        array = self.array
        if self.first:
            array.fill(READ_BYTES)
            self._check_start()
            try:
                array.find_array(self._head)
            except NoArray as exc:
                if exc.at_limit:
                    raise InputError(
                        self.builder.path,
                        f"no traceEvents array in its first {self.max_event} bytes: not a chrome trace "
                        f"({MAX_EVENT_BYTES_ENV} raises the limit)",
                    ) from None
                raise _Fallback("no traceEvents array") from None  # the whole-file path says what the file is
        else:
            array.stretch()
        array.fill(array.pos + SNIFF_BYTES)
        self.text_ts = (
            EPOCH_FLOAT_TS.search(array.buf, array.pos, min(array.pos + SNIFF_BYTES, array.end)) is not None
        )
        for _ in array.pieces(self._piece):
            report(0.95 * self.text.fraction)
        if self.last:
            self._decode_tail()
        else:
            self._decode_rest()

    def _check_start(self) -> None:
        """A chrome trace is a JSON object: anything else is refused before more of it is read (a gzip of
        gigabytes of zeros would otherwise be inflated whole)."""
        array = self.array
        start = array.buf[: min(array.end, 4096)].lstrip(b" \t\n\r")
        start = start.removeprefix(BOM).lstrip(b" \t\n\r")
        if not start or start[:1] == b"{":
            return
        if start[:1] == b"[":
            raise InputError(self.builder.path, "not a chrome trace: the top level is not a JSON object")
        raise InputError(self.builder.path, f"not valid JSON (it begins with {bytes(start[:8])!r})")

    def _head(self, pos: int) -> bool:
        """The header keys before the array (the text up to the `[`, closed by `]}`)."""
        try:
            head = HEAD_DECODER.decode(bytes(self.array.buf[:pos]).removeprefix(BOM) + b"]}")
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
            raise _Fallback("the text before its traceEvents array is not a JSON object's start") from None
        if head.traceEvents:
            raise _Fallback("an odd traceEvents key")
        self.head = head
        return True

    def _piece(self, view: memoryview) -> None:
        """Decode and add the events of a piece (`[` ... `]`, a view of the array's buffer)."""
        try:
            self._decode_and_add(view, "events")
        except _BadJSON as exc:
            # Before the `]` put at its end, the piece is the file's own text in its own context: a character
            # the parser rejects there is an error of the file (not of the cut).
            byte = error_byte(exc.message)
            own = byte is not None and byte < len(view) - 1 and "trailing characters" not in exc.message
            if own and not self.whole:
                raise _Fallback("a JSON error") from None
            if own:
                raise _BadJSON(shifted_bytes(exc.message, self.array.piece_origin)) from None
            raise NotBetweenEvents from None

    def _decode_and_add(self, text: Any, which: str) -> None:
        """Decode `text` (events, or the tail Struct) with the strict Structs first, then add its events;
        Raises _BadJSON when the text is not valid JSON (maybe a cut inside an event); for a field of the wrong
        type, InputError (reading the whole file) or _Fallback (a stretch: see _split)."""
        first_event = self.builder.n_events
        for strict in (True, False) if self.strict else (False,):
            decoders = DECODERS[(strict, self.text_ts)]
            try:
                decoded = getattr(decoders, which).decode(text)
            except msgspec.ValidationError as exc:
                if not strict:
                    if not self.whole:
                        raise _Fallback("a field of the wrong type") from None
                    raise InputError(self.builder.path, wrong_type_problem(exc, first_event)) from None
                self.strict_failures += 1
                self.strict = self.strict_failures < 2  # an odd file: stop trying the strict Structs
                continue
            except msgspec.DecodeError as exc:
                raise _BadJSON(str(exc)) from None
            except UnicodeDecodeError as exc:
                raise _BadJSON(f"bad UTF-8 at byte {exc.start} of a string") from None
            if which == "tail":
                self._read_header(decoded)
                events, exact = decoded.traceEvents, (lambda: exact_ts_of_trace(bytes(text)))
                shapes = lambda: shapes_of_trace(bytes(text))  # noqa: E731
            else:
                events, exact = decoded, (lambda: exact_ts_of_array(bytes(text)))
                shapes = lambda: shapes_of_array(bytes(text))  # noqa: E731
            del decoded
            if not self.whole:
                try:
                    self.builder.add(decoders.chunk(events, exact, shapes))
                except NotANumber:
                    raise _Fallback("a ts that is not a number") from None
            else:
                add_events(self.builder, decoders.chunk(events, exact, shapes))
            if self.builder.inexact_ts:
                self.text_ts = True  # later pieces keep `ts` as text from the start
            return

    def _decode_tail(self) -> None:
        """The rest of the file: the last events, the end of the array and the header keys after it."""
        origin = (
            self.array.dropped + self.array.pos - len(_TAIL_PREFIX)
        )  # (of the prefix's `{`: the file's own bytes follow)
        rest = self.array.rest(self.max_event + self.array.chunk_bytes)
        text = _TAIL_PREFIX + rest
        if (_KEY in rest or b"\\u" in rest) and _ANOTHER_KEY.search(rest):
            if not self.whole:
                raise _Fallback("a second traceEvents key")
            self._second_array(text, origin)
        try:
            self._decode_and_add(text, "tail")
        except _BadJSON as exc:
            if not self.whole:
                raise _Fallback("a JSON error") from None
            raise _BadJSON(shifted_bytes(exc.message, origin)) from None

    def _second_array(self, text: bytes, origin: int) -> None:
        """A second `traceEvents` key after the first array replaces it (JSON keeps the last value): when the
        tail holds one, the events read so far are dropped. (The pattern may also match inside a string:
        which array the key's last value is tells.)"""
        try:
            last = _RAW_TAIL.decode(text).traceEvents
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
            return  # the tail's own decode says what is wrong
        array_at = len(_TAIL_PREFIX) - 1
        if text[array_at : array_at + len(last)] == last:
            return
        self.builder = ColumnBuilder(self.builder.path, flows=self.builder.flows)

    def _decode_rest(self) -> None:
        """The last events of a stretch that ends inside the array: they must decode as a list of events."""
        rest = self.array.rest(self.max_event + self.array.chunk_bytes)
        try:
            self._decode_and_add(b"[" + rest + b"]", "events")
            return
        except _BadJSON:
            pass
        raise _Fallback("a stretch that does not end between events")

    def _read_header(self, tail: Any) -> None:
        self.tail_header = {
            key: getattr(tail, key) for key in HEADER_FIELDS if getattr(tail, key) is not UNSET
        }
        header = {}
        for key in HEADER_FIELDS:
            value = getattr(tail, key)
            value = getattr(self.head, key, UNSET) if value is UNSET else value
            header[key] = None if value is UNSET else value
        read_header(self.builder.info, header)
