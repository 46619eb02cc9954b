"""The text of a trace file for the chunk reader (see _stream): plain bytes read straight into the reader's
buffer, or gzip inflated block by block (limits.inflated, by ISA-L's inflater where installed), within the
input and gzip ratio limits."""

from __future__ import annotations

import io
import itertools

from stepscope.analysis.read.limits import INFLATE, inflated, max_gzip_ratio

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
