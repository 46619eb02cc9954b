"""The text of a trace file and its `traceEvents` array cut into pieces of whole events, for every reader of
the array (the loader's columns: _stream, _split; the event stream of merge and ops: event_stream). The text:
plain bytes read straight into the reader's buffer, or gzip inflated block by block (limits.inflated, by ISA-L's
inflater where installed), within the input and gzip ratio limits."""

from __future__ import annotations

import io
import itertools
import re
from collections.abc import Callable, Iterator
from typing import TypeVar

import msgspec

from stepscope.analysis.read.limits import (
    INFLATE,
    MAX_EVENT_BYTES_ENV,
    inflated,
    max_event_bytes,
    max_gzip_ratio,
)

T = TypeVar("T")

READ_BYTES = 1 << 13  # compressed bytes read from the file at a time (zlib copies what is left over)
OUT_BYTES = 1 << 15  # text inflated at a time (small blocks come from the heap, not fresh pages)


class TooLong(Exception):
    """The rest of the file, to be decoded in one piece, is longer than the event limit."""


class TraceText:
    """The (decompressed) text of an open file, read on demand into a reusable buffer; gzip is recognised by
    its magic bytes. Damaged gzip data raises limits.GzipDamaged (see gzip_problem for its words), text past
    `limit` TextOverLimit, a gzip bomb GzipBomb."""

    def __init__(
        self, fh: io.BufferedReader, size: int, limit: int, start: int = 0, stop: int | None = None
    ) -> None:
        """`start` / `stop`: a stretch of a plain (not gzipped) file, `stop` excluded."""
        self._fh = fh
        self._start = start
        self._size = max(size, 1)
        if start:
            fh.seek(start)
        self._left = (size if stop is None else stop) - start  # bytes of a plain file left to hand out
        self._pending = fh.read(min(2, self._left))  # a plain file's first bytes, not yet handed out
        self.ratio = max_gzip_ratio()
        self._blocks = None
        if self._pending == b"\x1f\x8b" and not start:
            compressed = itertools.chain([self._pending], iter(lambda: fh.read(READ_BYTES), b""))
            self._blocks = inflated(compressed, limit, OUT_BYTES, ratio=self.ratio, module=INFLATE)
        self._block = memoryview(b"")  # inflated text not handed out yet
        self.eof = False

    @property
    def fraction(self) -> float:
        return min((self._fh.tell() - self._start) / self._size, 1.0)

    def read_into(self, buf: bytearray, at: int, n: int) -> int:
        """Write up to `n` bytes of text at `buf[at:]` (which must have room); how many (0: the end)."""
        if self._blocks is None:
            n = min(n, self._left)
            head, self._pending = self._pending[:n], self._pending[n:]
            with memoryview(buf) as view:
                view[at : at + len(head)] = head
                got = len(head) + (self._fh.readinto(view[at + len(head) : at + n]) or 0)
            self._left -= got
            self.eof = got == 0
            return got
        if not self._block:
            block = next(self._blocks, None)
            if block is None:
                self.eof = True
                return 0
            self._block = memoryview(block)
        out, self._block = self._block[:n], self._block[n:]
        with memoryview(buf) as view:  # (a bytearray's own slice assignment copies `out` twice)
            view[at : at + len(out)] = out
        return len(out)

    def read_all(self, most: int) -> bytes:
        """The rest of the text; TooLong past `most` bytes."""
        parts = []
        buf = bytearray(OUT_BYTES)
        total = 0
        while got := self.read_into(buf, 0, OUT_BYTES):
            parts.append(bytes(buf[:got]))
            total += got
            if total > most:
                raise TooLong
        return b"".join(parts)


# --- the traceEvents array, cut into pieces of whole events ---------------------------------------------------------
LOOKAHEAD = 1 << 16  # text kept beyond a piece's target size, where its cut is looked for
CUT = re.compile(rb"\}[ \t\n\r]*,[ \t\n\r]*\{")
# The tokens that give the events' structure: a string (group 1: its closing quote, None where the text read so far
# ends inside it), or a brace or bracket
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(")?|[{}\[\]]')
# Cuts tried after one that does not decode, each checked as plain JSON first, before the event's end is found from
# the text's structure (which costs more per byte, in Python, but does not grow with the cuts an event holds)
PROBES = 128
_RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])
_CUT_OVERLAP = 4096  # text searched again for a cut after more is read (a cut straddling the old end)
_KEY = b'"traceEvents"'
_AFTER_KEY = re.compile(rb"[ \t\n\r]*:[ \t\n\r]*\[")
_ERROR_BYTE = re.compile(r"\(byte (\d+)\)")


class NotBetweenEvents(Exception):
    """Raised by a piece's decoder: the text up to the cut is not a list of whole events (the cut lies inside an
    event or a string), so a later cut is to be tried."""


class NoArray(Exception):
    """The text holds no top-level `traceEvents` array (`at_limit`: none in the event limit's first bytes)."""

    def __init__(self, at_limit: bool) -> None:
        super().__init__("no traceEvents array")
        self.at_limit = at_limit


class PieceTooLong(Exception):
    """Past the event limit without a cut that ends a piece: none at all (`tried` False: an event or a string
    longer than the limit), or none of those tried (inside one long string or event)."""

    def __init__(self, tried: bool) -> None:
        super().__init__("no end of an event")
        self.tried = tried


def too_long_problem(exc: PieceTooLong | TooLong, max_event: int) -> str:
    """What a piece past the event limit says: no end of an event in it, or none of the cuts tried decoded."""
    found = "no place to split the events found" if getattr(exc, "tried", True) else "no end of an event"
    return (
        f"{found} in {max_event} bytes (an event or a string longer than that; {MAX_EVENT_BYTES_ENV} raises the "
        "limit)"
    )


def json_problem(message: str) -> str:
    """msgspec's DecodeError message as the readers say it."""
    return "truncated JSON" if "truncated" in message else f"not valid JSON ({message})"


def error_byte(message: str) -> int | None:
    """The `N` of msgspec's `(byte N)`, if the message has one."""
    m = _ERROR_BYTE.search(message)
    return int(m.group(1)) if m else None


def shifted_bytes(message: str, origin: int) -> str:
    """msgspec's message with its `(byte N)` counted from the start of the file (`origin`: where the decoded
    text's byte 0 lies in it)."""
    return _ERROR_BYTE.sub(lambda m: f"(byte {int(m.group(1)) + origin})", message)


def _as_json_list(text: memoryview) -> None:
    """NotBetweenEvents unless `text` reads as a JSON list (its values left as text: a tenth of a decode)."""
    try:
        _RAW_LIST.decode(text)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        raise NotBetweenEvents from None


class EventArray:
    """The `traceEvents` array of a trace's text in pieces of whole events, for every reader of it (the loader's
    columns, _stream and _split; the event stream of merge and ops, event_stream).

    Where to cut: after an event's closing brace, at a `}` `,` `{` (whitespace allowed). Such a spot may also lie
    inside an event (an array of objects in its args) or inside a string; the piece is then not a list of whole
    events and its decode fails: the end of the event there is then found from the text's structure (its
    strings skipped, braces and brackets counted from the piece's start), in time linear in the text however
    many such spots an event holds. A piece that decodes is exactly the
    events the whole-file decoder would have read there: it starts where an event starts, and JSON is read the
    same way in either context.

    The text sits in one bytearray, reused: `buf[:end]` holds text, the piece at work starts at `pos`. A piece is
    decoded in place: the byte before it and the byte after its last `}` are overwritten with `[` and `]` (both
    a comma or whitespace, which the piece does not need), and handed to the reader's decoder as a memoryview
    (valid during the call). After the last piece, `rest()` is the text left: the last events, the end of the
    array and the document's keys after it."""

    def __init__(self, text: TraceText, chunk_bytes: int) -> None:
        self.text = text
        self.chunk_bytes = max(chunk_bytes, 1)
        self.max_event = max_event_bytes()
        self.buf = bytearray(self.chunk_bytes + LOOKAHEAD + 2 * OUT_BYTES)
        self.end = 0
        self.pos = 0
        self.dropped = 0  # text offset of buf[0] (msgspec's errors name a byte of the piece)
        self.inner = False  # the last piece's first cut lay inside an event

    @property
    def piece_origin(self) -> int:
        """Where the piece at work's `[` lies in the text."""
        return self.dropped + self.pos - 1

    def fill(self, size: int) -> bool:
        """Read until `buf[:end]` holds `size` bytes or the text ends; False when nothing more came."""
        before = self.end
        while self.end < size and not self.text.eof:
            if len(self.buf) < self.end + OUT_BYTES:
                self.buf.extend(bytes(max(len(self.buf), OUT_BYTES)))
            self.end += self.text.read_into(self.buf, self.end, len(self.buf) - self.end)
        return self.end > before

    def find_array(self, head: Callable[[int], bool]) -> None:
        """Go to just after the `[` of the top-level traceEvents array: the first `"traceEvents"` key followed by
        `:[` for which `head(offset)` (the text before `offset` read as the document's start) holds; a key
        spelled inside a string of an earlier key is passed over. NoArray when there is none."""
        self.fill(READ_BYTES)
        searched = 0
        while True:
            k = self.buf.find(_KEY, searched, self.end)
            if k >= 0:
                self.fill(k + len(_KEY) + 4096)
                m = _AFTER_KEY.match(self.buf, k + len(_KEY), self.end)
                if m is not None and head(m.end()):
                    self.pos = m.end()
                    return
                searched = k + 1
                continue
            searched = max(self.end - len(_KEY), 0)
            if self.end > self.max_event:  # (the text before the array is decoded in one piece)
                raise NoArray(at_limit=True)
            if not self.fill(self.end + READ_BYTES):
                raise NoArray(at_limit=False)

    def stretch(self) -> None:
        """A stretch of the array that begins with an event's `{` (see _split): one byte before it, for the `[`."""
        self.buf[0] = ord(" ")
        self.end = self.pos = 1

    def pieces(self, decode: Callable[[memoryview], T]) -> Iterator[T]:
        """Each piece of about `chunk_bytes` of whole events, as `decode` gives it (called with `[` + the piece +
        `]`; NotBetweenEvents: try a later cut). Ends where the text left fits in one piece: `rest()` has it."""
        while True:
            self.fill(self.pos + self.chunk_bytes + LOOKAHEAD)
            if self.text.eof and self.end - self.pos <= self.chunk_bytes:
                return
            found = self._next(decode)
            if found is None:
                return
            yield found[0]

    def _next(self, decode: Callable[[memoryview], T]) -> tuple[T] | None:
        pos = self.pos
        at = pos + self.chunk_bytes
        m = self._cut(pos, at, tried=False)
        if m is None:
            return None  # the text ended: what is left is the rest
        # (where the last piece's first cut lay inside an event, this one is checked as plain JSON first too: a
        # file of events holding lists of objects has most of its cuts inside them)
        found = None
        if not self.inner or self._is_json(pos, m.start()):
            found = self._decoded(decode, pos, m.start())
        self.inner = found is None
        tries = 0
        while found is None and tries < PROBES:
            # the cut lies inside an event or a string: the next ones, each first checked as plain JSON (a tenth
            # of a decode's cost), then the piece to it decoded
            tries += 1
            m = self._cut(pos, m.end(), tried=True)
            if m is None:
                return None
            if self._is_json(pos, m.start()):
                found = self._decoded(decode, pos, m.start())
        if found is None:
            # still inside (an event holding a long list of objects, a string full of cuts): the end of the event
            # there, from the text's structure
            brace = self._event_end(pos, at)
            if brace is None:
                return None
            self.fill(brace + _CUT_OVERLAP)
            m = CUT.match(self.buf, brace, self.end)
            if m is None:  # (the array's end follows: the rest)
                return None
            found = self._decoded(decode, pos, brace)
            if found is None:  # not JSON there either: the rest, whose decode says what is wrong
                return None
        nxt = m.end() - 1  # the next event's `{`; the byte before it becomes the next piece's `[`
        with memoryview(self.buf) as whole:
            whole[: self.end - nxt + 1] = whole[nxt - 1 : self.end]
        self.end -= nxt - 1
        self.dropped += nxt - 1
        self.pos = 1
        return found

    def _cut(self, pos: int, after: int, tried: bool) -> re.Match[bytes] | None:
        """The first cut at or after `after` (more text read as needed); None where the text ends first,
        PieceTooLong where the piece from `pos` grows past the event limit first."""
        m = CUT.search(self.buf, after, self.end)
        while m is None:
            if self.end - pos > self.chunk_bytes + self.max_event:
                raise PieceTooLong(tried)
            searched = self.end
            if not self.fill(self.end + READ_BYTES):
                return None
            # only the new text, and a little before it for a cut that straddles the old end: searching from
            # `after` again made a long stretch without a cut quadratic
            m = CUT.search(self.buf, max(after, searched - _CUT_OVERLAP), self.end)
        return m

    def _decoded(self, decode: Callable[[memoryview], T], pos: int, brace: int) -> tuple[T] | None:
        """The piece from `pos` to the `}` at `brace`, decoded in place; None where it is not whole events."""
        close = brace + 1  # the byte after the piece's last `}` (a comma or whitespace): its `]` goes there
        saved = self.buf[close]
        self.buf[pos - 1], self.buf[close] = ord("["), ord("]")
        view = memoryview(self.buf)
        try:
            return (decode(view[pos - 1 : close + 1]),)
        except NotBetweenEvents:
            return None
        finally:
            view.release()  # before the buffer may grow
            self.buf[close] = saved

    def _is_json(self, pos: int, brace: int) -> bool:
        """Whether the piece from `pos` to the `}` at `brace` reads as a JSON list (its values left as text)."""
        return self._decoded(_as_json_list, pos, brace) is not None

    def _event_end(self, pos: int, at: int) -> int | None:
        """The `}` that closes the first event ending past `at`, from the events' structure from `pos` (the start
        of an event): their strings skipped, their braces and brackets counted. Linear in the text, however many
        `}` `,` `{` an event holds (a list of objects in its args) or a string holds. None where the array or the
        text ends first; PieceTooLong past the event limit."""
        scan, depth = pos, 0
        while True:
            for token in _TOKEN.finditer(self.buf, scan, self.end):
                byte = self.buf[token.start()]
                if byte == 0x22:  # a string
                    if token.group(1) is None:  # not ended yet: read on, then scan it again
                        break
                elif byte in (0x7B, 0x5B):  # { [
                    depth += 1
                else:
                    depth -= 1
                    if depth < 0:  # the array's own `]`
                        return None
                    if depth == 0 and token.end() > at:
                        return token.start()
                scan = token.end()
            else:
                scan = self.end
            if self.end - pos > self.chunk_bytes + self.max_event:
                raise PieceTooLong(tried=True)
            if not self.fill(self.end + READ_BYTES):
                return None

    def rest(self, most: int) -> bytes:
        """The text from the piece at work to the end (after `pieces`); TooLong past `most` bytes more."""
        rest = bytes(self.buf[self.pos : self.end]) + self.text.read_all(most)
        self.buf = bytearray()
        return rest
