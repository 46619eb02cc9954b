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
    json_problem,
    load_whole,
    read_header,
    shapes_of_array,
    shapes_of_trace,
    wrong_type_problem,
)
from stepscope.analysis.read._numparse import NotANumber
from stepscope.analysis.read._parts import FileTable
from stepscope.analysis.read._text import OUT_BYTES, READ_BYTES, TooLong, TraceText
from stepscope.analysis.read.limits import (
    DEFAULT_MAX_TRACE_BYTES,
    LIMIT_ENV,
    MAX_EVENT_BYTES_ENV,
    GzipBomb,
    GzipDamaged,
    TextOverLimit,
    gzip_bomb_problem,
    gzip_problem,
    max_event_bytes,
    max_input_bytes,
)
from stepscope.errors import InputError

__all__ = ["CHUNK_BYTES", "FileTable", "load_file"]

CHUNK_BYTES = 1 << 20  # JSON text decoded at a time (its Structs take about as much memory again). The whole
# load (inflate, decode, columns; CPU time, paired) is 3-7% cheaper with 1 MB than with 256 KB: each piece's
# columns cost some 40 numpy calls whatever its size, and that outweighs the Structs staying in the CPU caches
_LOOKAHEAD = 1 << 16  # text kept beyond a chunk's target size, where its cut is looked for
_MAX_NS = 1 << 62
_CUT_OVERLAP = 4096  # text searched again for a cut spot after more is read
_MAX_TRIES = 4  # cut spots tried for one chunk before the rest of the file is decoded in one piece
_CUT = re.compile(rb"\}[ \t\n\r]*,[ \t\n\r]*\{")
_KEY = b'"traceEvents"'
_AFTER_KEY = re.compile(rb"[ \t\n\r]*:[ \t\n\r]*\[")


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
_ERROR_BYTE = re.compile(r"\(byte (\d+)\)")


def _error_byte(message: str) -> int | None:
    """The `N` of msgspec's `(byte N)`, if the message has one."""
    m = _ERROR_BYTE.search(message)
    return int(m.group(1)) if m else None


def _shifted_bytes(message: str, origin: int) -> str:
    """msgspec's message with its `(byte N)` counted from the start of the file (`origin`: where the decoded
    text's byte 0 lies in it)."""
    return _ERROR_BYTE.sub(lambda m: f"(byte {int(m.group(1)) + origin})", message)


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
            raise InputError(path, json_problem(exc.message)) from None
        except TextOverLimit:
            raise InputError(
                path, f"gzip data inflates to more than {limit} bytes (the limit; {LIMIT_ENV} raises it)"
            ) from None
        except GzipBomb:
            raise InputError(path, gzip_bomb_problem(reader.text.ratio)) from None
        except TooLong:
            raise InputError(
                path,
                f"no place to split the events found in {reader.max_event} bytes (an event or a string longer "
                f"than that; {MAX_EVENT_BYTES_ENV} raises the limit)",
            ) from None
        return reader.builder.finish(rank_hint)


class _ChunkReader:
    """Splits the text into pieces of whole events and adds each to the builder.

    The text sits in one bytearray, reused: `buf[:end]` holds text, the piece at work starts at `pos`. A
    piece is decoded in place: the byte before it and the byte after its last `}` are overwritten with
    `[` and `]` (both are a comma or whitespace, which the piece does not need)."""

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
        self.chunk_bytes = max(chunk_bytes, 1)
        self.builder = ColumnBuilder(path, flows=flows, spill=spill)
        self.buf = bytearray(self.chunk_bytes + _LOOKAHEAD + 2 * OUT_BYTES)
        self.end = 0
        self.strict = True
        self.strict_failures = 0
        self.text_ts = False
        self.max_event = max_event_bytes()
        # Reading the whole file (not a stretch of it): an error found in a piece is the file's own, said here
        # as the whole-file decoder says it. `dropped`: text offset of buf[0] (JSON errors name a byte).
        self.whole = first and last
        self.dropped = 0

    def _too_long(self, piece: int) -> None:
        """A piece with no end of an event in it grew past the event limit: stop before reading more."""
        if piece > self.chunk_bytes + self.max_event:
            raise InputError(
                self.builder.path,
                f"no end of an event in {self.max_event} bytes (an event or a string longer than that; "
                f"{MAX_EVENT_BYTES_ENV} raises the limit)",
            )

    def _fill(self, size: int) -> bool:
        """Read until `buf[:end]` holds `size` bytes or the text ends; False when nothing more came."""
        before = self.end
        while self.end < size and not self.text.eof:
            if len(self.buf) < self.end + OUT_BYTES:
                self.buf.extend(bytes(max(len(self.buf), OUT_BYTES)))
            self.end += self.text.read_into(self.buf, self.end, len(self.buf) - self.end)
        return self.end > before

    def run(self, report: Callable[[float], None]) -> None:
        if self.first:
            pos = self._find_array()
            self.head = self._decode_head(pos)
        else:  # a byte before the first event, for the piece's `[`
            self.buf[0] = ord(" ")
            self.end = pos = 1
            self._fill(pos + SNIFF_BYTES)
        self.text_ts = EPOCH_FLOAT_TS.search(self.buf, pos, min(pos + SNIFF_BYTES, self.end)) is not None
        while True:
            self._fill(pos + self.chunk_bytes + _LOOKAHEAD)
            if self.text.eof and self.end - pos <= self.chunk_bytes:
                break
            nxt = self._next_chunk(pos)
            if nxt is None:
                break
            # keep one byte before the next event: it becomes the piece's `[`
            with memoryview(self.buf) as view:
                view[: self.end - nxt + 1] = view[nxt - 1 : self.end]
            self.end -= nxt - 1
            self.dropped += nxt - 1
            pos = 1
            report(0.95 * self.text.fraction)
        if self.last:
            self._decode_tail(pos, self.head)
        else:
            self._decode_rest(pos)

    def _find_array(self) -> int:
        """Offset just after the `[` of the top-level traceEvents array."""
        self._fill(READ_BYTES)
        self._check_start()
        searched = 0
        while True:
            k = self.buf.find(_KEY, searched, self.end)
            if k >= 0:
                self._fill(k + len(_KEY) + 4096)
                m = _AFTER_KEY.match(self.buf, k + len(_KEY), self.end)
                if m is not None:
                    return m.end()
                searched = k + 1
                continue
            searched = max(self.end - len(_KEY), 0)
            if self.end > self.max_event:  # (the text before the array is decoded in one piece)
                raise InputError(
                    self.builder.path,
                    f"no traceEvents array in its first {self.max_event} bytes: not a chrome trace "
                    f"({MAX_EVENT_BYTES_ENV} raises the limit)",
                )
            if not self._fill(self.end + READ_BYTES):
                raise _Fallback("no traceEvents array")  # the whole-file path says what the file is

    def _check_start(self) -> None:
        """A chrome trace is a JSON object: anything else is refused before more of it is read (a gzip of
        gigabytes of zeros would otherwise be inflated whole)."""
        start = self.buf[: min(self.end, 4096)].lstrip(b" \t\n\r")
        start = start.removeprefix(b"\xef\xbb\xbf").lstrip(b" \t\n\r")  # a UTF-8 byte order mark
        if not start or start[:1] == b"{":
            return
        if start[:1] == b"[":
            raise InputError(self.builder.path, "not a chrome trace: the top level is not a JSON object")
        raise InputError(self.builder.path, f"not valid JSON (it begins with {bytes(start[:8])!r})")

    def _decode_head(self, pos: int) -> Any:
        """The header keys before the array (the text up to the `[`, closed by `]}`)."""
        try:
            head = HEAD_DECODER.decode(bytes(self.buf[:pos]).removeprefix(BOM) + b"]}")
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
            raise _Fallback("the text before its traceEvents array is not a JSON object's start") from None
        if head.traceEvents:
            raise _Fallback("an odd traceEvents key")
        return head

    def _next_chunk(self, pos: int) -> int | None:
        """Decode and add the events of the next piece from `pos`; the offset of the next event, or None
        when the rest of the file should be decoded in one piece."""
        at = pos + self.chunk_bytes
        for _ in range(_MAX_TRIES):
            m = _CUT.search(self.buf, at, self.end)
            while m is None:
                searched = self.end
                self._too_long(self.end - pos)
                if not self._fill(self.end + READ_BYTES):
                    break
                # Only the new text, and a little before it for a cut that straddles the old end: searching
                # from `at` again made a long stretch without a cut quadratic. (A cut whose whitespace is
                # longer than the overlap may be missed; missing one is safe, the rest is decoded in one piece.)
                m = _CUT.search(self.buf, max(at, searched - _CUT_OVERLAP), self.end)
            if m is None:
                return None
            close = m.start() + 1  # the byte after the piece's last `}`
            saved = self.buf[close]
            self.buf[pos - 1], self.buf[close] = ord("["), ord("]")
            view = memoryview(self.buf)
            try:
                self._decode_and_add(view[pos - 1 : close + 1], "events")
                return m.end() - 1
            except _BadJSON as exc:
                # Before the `]` put at `close`, the piece is the file's own text in its own context: a
                # character the parser rejects there is an error of the file (not of the cut).
                byte = _error_byte(exc.message)
                own = (
                    byte is not None and byte < close - (pos - 1) and "trailing characters" not in exc.message
                )
                if own and not self.whole:
                    raise _Fallback("a JSON error") from None
                if own:
                    raise _BadJSON(_shifted_bytes(exc.message, self.dropped + pos - 1)) from None
            finally:
                view.release()  # before the buffer may grow
                self.buf[close] = saved
            at = close
        return None

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

    def _decode_tail(self, pos: int, head: Any) -> None:
        """The rest of the file: the last events, the end of the array and the header keys after it."""
        rest = bytes(self.buf[pos : self.end]) + self.text.read_all(self.max_event + self.chunk_bytes)
        self.buf = bytearray()
        self.head = head
        text = _TAIL_PREFIX + rest
        origin = self.dropped + pos - len(_TAIL_PREFIX)  # (of the prefix's `{`: the file's own bytes follow)
        if (_KEY in rest or b"\\u" in rest) and _ANOTHER_KEY.search(rest):
            if not self.whole:
                raise _Fallback("a second traceEvents key")
            self._second_array(text, origin)
        try:
            self._decode_and_add(text, "tail")
        except _BadJSON as exc:
            if not self.whole:
                raise _Fallback("a JSON error") from None
            raise _BadJSON(_shifted_bytes(exc.message, origin)) from None

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

    def _decode_rest(self, pos: int) -> None:
        """The last events of a stretch that ends inside the array: they must decode as a list of events."""
        rest = bytes(self.buf[pos : self.end]) + self.text.read_all(self.max_event + self.chunk_bytes)
        self.buf = bytearray()
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
