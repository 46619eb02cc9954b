"""A pickle reader for files from unknown sources: plain containers and scalars only, in bounded memory and time.

Python's own unpickler runs any callable a pickle names, sizes its memo by the largest index a pickle gives
(10 bytes asking for index 2**28 cost 4 GiB) and builds whatever the opcodes say (64 MiB of EMPTY_LIST opcodes
cost 5.8 GiB). This reader refuses every global, keeps the memo as a list that grows one entry per PUT (an
index past its end is refused), and counts what it builds as it builds it: an estimate of the bytes the
objects hold, and the opcodes it has run, each against a budget. Input arrives in pieces, so the text of a
gzip'd file is never held whole.

Opcodes follow the pickle protocol (0-5) as `pickletools` documents them; the code is ours.
"""

from __future__ import annotations

import codecs
import struct
import sys
from collections.abc import Iterator
from typing import Any

__all__ = ["PickleRefused", "RefusedGlobal", "load_plain_pickle"]

# Bytes an object costs, with its garbage-collector header and the slot that holds it (CPython 3.11, 64-bit).
_SLOT = 8
_LIST = 80
_DICT = 88
_DICT_ITEM = 48  # index, entry and growth room per key
_SET = 340  # measured: 2.2 M empty sets took 730 MB
_SET_ITEM = 40
_TUPLE = 64
_INT = 40
_FLOAT = 32
_BYTES = 48
_LOOKAHEAD = 9  # an opcode and its longest fixed-size argument
_MAX_LINE = 1 << 20  # a protocol-0 argument line (a number, a memo index, an escaped string)

_unpack_i4 = struct.Struct("<i").unpack_from
_unpack_u4 = struct.Struct("<I").unpack_from
_unpack_u2 = struct.Struct("<H").unpack_from
_unpack_u8 = struct.Struct("<Q").unpack_from
_unpack_f8 = struct.Struct(">d").unpack_from

_REFUSED_OPS = {
    ord("c"): "GLOBAL",
    0x93: "STACK_GLOBAL",
    ord("R"): "REDUCE",
    ord("b"): "BUILD",
    ord("i"): "INST",
    ord("o"): "OBJ",
    0x81: "NEWOBJ",
    0x92: "NEWOBJ_EX",
    0x82: "EXT1",
    0x83: "EXT2",
    0x84: "EXT4",
    ord("P"): "PERSID",
    ord("Q"): "BINPERSID",
    0x97: "NEXT_BUFFER",
    0x98: "READONLY_BUFFER",
}


_CONTAINERS = (list, dict, tuple, set, frozenset)
_SINGLETONS: dict[int, Any] = {ord("N"): None, 0x88: True, 0x89: False, ord(")"): ()}


def _check_set_items(items: list[Any]) -> None:
    # str and bytes only: their hash is randomized and cached (numbers could be chosen to collide).
    if any(type(x) not in (str, bytes) for x in items):
        raise PickleRefused("a set of other things than str or bytes: not accepted")


class PickleRefused(Exception):
    """The pickle asks for something this reader never does (a global, an out-of-range memo index, more than
    the budget), or its bytes are not a pickle. The message says which, in one line."""


class RefusedGlobal(PickleRefused):
    """The pickle asked for a class, a function or a persistent id: never loaded, the file is rejected."""


_SLICE = 1 << 16  # input between two checks of the budget: at most 16 MiB of the costliest objects


def _sliced(pieces: Iterator[bytes]) -> Iterator[bytes]:
    for piece in pieces:
        for at in range(0, len(piece), _SLICE):
            yield piece[at : at + _SLICE]


class _Input:
    """Bytes from an iterator of pieces, with at least `_LOOKAHEAD` bytes past the read position while any
    remain."""

    def __init__(self, pieces: Iterator[bytes]) -> None:
        self._pieces = _sliced(pieces)
        self.buf = b""
        self.pos = 0
        self.eof = False
        self.consumed = 0  # bytes before buf[0]

    def refill(self, want: int) -> None:
        """Make `buf[pos:]` hold `want` bytes, or all that is left."""
        parts = [self.buf[self.pos :]]
        have = len(parts[0])
        self.consumed += self.pos
        while have < want and not self.eof:
            piece = next(self._pieces, None)
            if piece is None:
                self.eof = True
                break
            parts.append(piece)
            have += len(piece)
        self.buf = b"".join(parts)
        self.pos = 0

    def take(self, n: int) -> bytes:
        if len(self.buf) - self.pos < n:
            self.refill(n)
            if len(self.buf) < n:
                raise PickleRefused("truncated pickle")
        data = self.buf[self.pos : self.pos + n]
        self.pos += n
        return data

    def line(self) -> bytes:
        """The bytes up to the next newline (excluded), which is consumed."""
        end = self.buf.find(b"\n", self.pos)
        while end < 0:
            if len(self.buf) - self.pos > _MAX_LINE or self.eof:
                raise PickleRefused("truncated pickle or an argument line longer than 1 MiB")
            searched = len(self.buf) - self.pos
            self.refill(searched + (1 << 16))
            end = self.buf.find(b"\n", self.pos + searched)
        text = self.buf[self.pos : end]
        self.pos = end + 1
        return text


def load_plain_pickle(pieces: Iterator[bytes], *, max_bytes: int, max_ops: int) -> tuple[Any, bool]:
    """The object a pickle builds from plain containers and scalars, and whether a container in it is reached
    twice (a memo reference or DUP of a container: its readers must count it as a tree, not as built).

    Raises PickleRefused when the pickle names a global, a memo index beyond the memo, builds objects
    estimated past `max_bytes`, runs more than `max_ops` opcodes, or is damaged."""
    try:
        return _Reader(pieces, max_bytes, max_ops).run()
    except PickleRefused:
        raise
    except (IndexError, struct.error):
        raise PickleRefused("damaged pickle: an opcode without its operands") from None
    except (ValueError, TypeError, UnicodeDecodeError, OverflowError) as exc:
        raise PickleRefused(f"damaged pickle ({type(exc).__name__}: {exc})") from None
    except MemoryError:
        raise PickleRefused("pickle too large to load in this machine's memory") from None


class _Reader:
    def __init__(self, pieces: Iterator[bytes], max_bytes: int, max_ops: int) -> None:
        self.src = _Input(pieces)
        self.max_bytes = max_bytes
        self.max_ops = max_ops
        self.used = 0  # estimated bytes of what is built
        self.ops = 0
        self.stack: list[Any] = []
        self.marks: list[int] = []
        self.memo: list[Any] = []
        self.shared = False

    def _over(self) -> None:
        if self.used > self.max_bytes:
            raise PickleRefused(
                f"its objects would take more than {self.max_bytes >> 20} MiB of memory "
                "(STEPSCOPE_MAX_INPUT_BYTES raises the limit)"
            )
        if self.ops > self.max_ops:
            raise PickleRefused(
                f"more than {self.max_ops} pickle opcodes (STEPSCOPE_MAX_INPUT_BYTES raises the limit)"
            )

    def _pop_mark(self) -> list[Any]:
        if not self.marks:
            raise PickleRefused("damaged pickle: a MARK is missing")
        at = self.marks.pop()
        items = self.stack[at:]
        del self.stack[at:]
        return items

    def _get(self, index: int) -> None:
        if not 0 <= index < len(self.memo):
            raise PickleRefused(f"memo index {index} beyond the {len(self.memo)} entries stored")
        value = self.memo[index]
        if isinstance(value, (list, dict, tuple, set, frozenset)):
            self.shared = True
        self.stack.append(value)
        self.used += _SLOT

    def _put(self, index: int) -> int:
        """Store the top of the stack at memo `index` (the next one, or one already stored); its cost."""
        if index == len(self.memo):
            self.memo.append(self.stack[-1])
            return _SLOT
        if 0 <= index < len(self.memo):
            self.memo[index] = self.stack[-1]
            return 0
        raise PickleRefused(f"memo index {index} beyond the {len(self.memo)} entries stored")

    def _text(self, data: bytes, encoding: str = "utf-8") -> str:
        s = data.decode(encoding, "surrogatepass" if encoding == "utf-8" else "strict")
        self.used += sys.getsizeof(s) + _SLOT
        return s

    def _bytes(self, data: bytes) -> bytes:
        self.used += len(data) + _BYTES
        return data

    def _set_items(self, target: Any, items: list[Any]) -> int:
        """Add key-value pairs to a dict; their cost."""
        if type(target) is not dict or len(items) % 2:
            raise PickleRefused("damaged pickle: SETITEMS without a dict and key-value pairs")
        for i in range(0, len(items), 2):
            key = items[i]
            # Keys are strings: their hash is randomized and cached, so no key can cost more than once.
            if type(key) is not str:
                raise PickleRefused(f"a dict key of type {type(key).__name__}: only str keys are accepted")
            target[key] = items[i + 1]
        return _DICT_ITEM * (len(items) // 2)

    def run(self) -> tuple[Any, bool]:
        """The loop over opcodes: the ones real snapshots are made of inline, with the read position in a local
        (a method call or an attribute write per opcode would double the time); the rest in `_rare`."""
        src, stack, memo, marks = self.src, self.stack, self.memo, self.marks
        push, remember = stack.append, memo.append
        containers = _CONTAINERS
        used = ops = 0
        buf, pos, low = src.buf, src.pos, -1
        while True:
            if (
                pos > low
            ):  # fewer than _LOOKAHEAD bytes left in the buffer: more input, and the budget checked
                src.pos = pos
                if not src.eof:
                    src.refill(_SLICE)
                buf, pos = src.buf, src.pos
                low = len(buf) - (1 if src.eof else _LOOKAHEAD)
                self.used, self.ops = used, ops
                self._over()
                if pos >= len(buf):
                    raise PickleRefused("truncated pickle: no STOP opcode")
            ops += 1
            op = buf[pos]
            if op == 0x6A or op == 0x68:  # j LONG_BINGET, h BINGET
                if op == 0x6A:
                    index = _unpack_u4(buf, pos + 1)[0]
                    pos += 5
                else:
                    index = buf[pos + 1]
                    pos += 2
                if index >= len(memo):
                    raise PickleRefused(f"memo index {index} beyond the {len(memo)} entries stored")
                value = memo[index]
                if isinstance(value, containers):
                    self.shared = True
                push(value)
                used += _SLOT
            elif op == 0x94:  # MEMOIZE
                pos += 1
                remember(stack[-1])
                used += _SLOT
            elif op == 0x28:  # ( MARK
                pos += 1
                marks.append(len(stack))
                used += _SLOT
            elif op == 0x7D:  # } EMPTY_DICT
                pos += 1
                push({})
                used += _DICT
            elif op == 0x5D:  # ] EMPTY_LIST
                pos += 1
                push([])
                used += _LIST
            elif op == 0x75:  # u SETITEMS
                pos += 1
                items = self._pop_mark()
                used += self._set_items(stack[-1], items)
            elif op == 0x65:  # e APPENDS
                pos += 1
                items = self._pop_mark()
                target = stack[-1]
                if type(target) is not list:
                    raise PickleRefused("damaged pickle: APPENDS without a list")
                target.extend(items)
            elif op == 0x4B:  # K BININT1
                push(buf[pos + 1])
                pos += 2
                used += _SLOT
            elif op == 0x4A:  # J BININT
                push(_unpack_i4(buf, pos + 1)[0])
                pos += 5
                used += _INT
            elif op == 0x47:  # G BINFLOAT
                push(_unpack_f8(buf, pos + 1)[0])
                pos += 9
                used += _FLOAT
            elif op == 0x8C or op == 0x8A:  # SHORT_BINUNICODE, LONG1: a one-byte length, then the bytes
                stop = pos + 2 + buf[pos + 1]
                if stop <= len(buf):
                    data = buf[pos + 2 : stop]
                    pos = stop
                else:  # the bytes run past the buffer
                    src.pos = pos + 2
                    data = src.take(buf[pos + 1])
                    buf, pos = src.buf, src.pos
                    low = len(buf) - (1 if src.eof else _LOOKAHEAD)
                if op == 0x8C:
                    text = data.decode("utf-8", "surrogatepass")
                    push(text)
                    used += _SLOT + sys.getsizeof(text)
                else:
                    push(int.from_bytes(data, "little", signed=True))
                    used += _INT
            elif op == 0x71:  # q BINPUT
                used += self._put(buf[pos + 1])
                pos += 2
            elif op == 0x72:  # r LONG_BINPUT
                used += self._put(_unpack_u4(buf, pos + 1)[0])
                pos += 5
            elif op == 0x2E:  # . STOP
                self.used, self.ops = used, ops
                self._over()
                if not stack:
                    raise PickleRefused("damaged pickle: STOP with nothing built")
                return stack.pop(), self.shared
            else:
                ops += 1  # the rarer opcodes take about twice as long: they count twice
                self.used = used
                src.pos = pos + 1
                self._rare(op, pos)
                used = self.used
                buf, pos = src.buf, src.pos
                low = len(buf) - (1 if src.eof else _LOOKAHEAD)

    def _rare(self, op: int, pos: int) -> None:
        src, stack, push = self.src, self.stack, self.stack.append
        if op == 0x58:  # X BINUNICODE
            push(self._text(self._take_sized(_unpack_u4(src.take(4))[0])))
        elif op == 0x4D:  # M BININT2
            push(_unpack_u2(src.take(2))[0])
            self.used += _INT
        elif op == 0x73:  # s SETITEM
            value = stack.pop()
            key = stack.pop()
            self.used += self._set_items(stack[-1], [key, value])
        elif op == 0x61:  # a APPEND
            value = stack.pop()
            target = stack[-1]
            if type(target) is not list:
                raise PickleRefused("damaged pickle: APPEND without a list")
            target.append(value)
        elif op == 0x8B:  # LONG4
            n = _unpack_i4(src.take(4))[0]
            if n < 0:
                raise PickleRefused("damaged pickle: a negative LONG4 length")
            self._reserve(n)
            push(int.from_bytes(src.take(n), "little", signed=True))
            self.used += _INT + n
        elif op in _SINGLETONS:  # NONE, NEWTRUE, NEWFALSE, EMPTY_TUPLE
            push(_SINGLETONS[op])
            self.used += _SLOT
        elif op in (0x85, 0x86, 0x87):  # TUPLE1, TUPLE2, TUPLE3
            n = op - 0x84
            if len(stack) - (self.marks[-1] if self.marks else 0) < n:
                raise PickleRefused("damaged pickle: a TUPLE without its items")
            items = stack[-n:]
            del stack[-n:]
            push(tuple(items))
            self.used += _TUPLE
        elif op == 0x74:  # t TUPLE
            push(tuple(self._pop_mark()))
            self.used += _TUPLE
        elif op == 0x6C:  # l LIST
            push(self._pop_mark())
            self.used += _LIST
        elif op == 0x64:  # d DICT
            built: dict[str, Any] = {}
            self.used += _DICT + self._set_items(built, self._pop_mark())
            push(built)
        elif op == 0x8F:  # EMPTY_SET
            push(set())
            self.used += _SET
        elif op == 0x90:  # ADDITEMS
            items = self._pop_mark()
            target = stack[-1]
            if type(target) is not set:
                raise PickleRefused("damaged pickle: ADDITEMS without a set")
            _check_set_items(items)
            target.update(items)
            self.used += _SET_ITEM * len(items)
        elif op == 0x91:  # FROZENSET
            items = self._pop_mark()
            _check_set_items(items)
            push(frozenset(items))
            self.used += _SET + _SET_ITEM * len(items)
        elif op == 0x30:  # 0 POP
            if self.marks and self.marks[-1] == len(stack):
                self.marks.pop()  # pickle's POP of an empty stack segment drops the mark
            else:
                stack.pop()
        elif op == 0x31:  # 1 POP_MARK
            self._pop_mark()
        elif op == 0x32:  # 2 DUP
            value = stack[-1]
            if isinstance(value, _CONTAINERS):
                self.shared = True
            push(value)
            self.used += _SLOT
        elif op == 0x70:  # p PUT
            self.used += self._put(int(src.line()))
        elif op == 0x67:  # g GET
            self._get(int(src.line()))
        elif op == 0x43:  # C SHORT_BINBYTES
            push(self._bytes(src.take(src.take(1)[0])))
        elif op == 0x42:  # B BINBYTES
            push(self._bytes(self._take_sized(_unpack_u4(src.take(4))[0])))
        elif op == 0x8E:  # BINBYTES8
            push(self._bytes(self._take_sized(_unpack_u8(src.take(8))[0])))
        elif op == 0x96:  # BYTEARRAY8
            push(bytearray(self._bytes(self._take_sized(_unpack_u8(src.take(8))[0]))))
        elif op == 0x8D:  # BINUNICODE8
            push(self._text(self._take_sized(_unpack_u8(src.take(8))[0])))
        elif op == 0x55:  # U SHORT_BINSTRING (a Python 2 str: ASCII, as pickle reads it by default)
            push(self._text(src.take(src.take(1)[0]), "ascii"))
        elif op == 0x54:  # T BINSTRING
            n = _unpack_i4(src.take(4))[0]
            if n < 0:
                raise PickleRefused("damaged pickle: a negative BINSTRING length")
            push(self._text(self._take_sized(n), "ascii"))
        elif op == 0x49:  # I INT (text; I01 and I00 are True and False)
            line = src.line()
            push(True if line == b"01" else False if line == b"00" else int(line))
            self.used += _INT
        elif op == 0x4C:  # L LONG (text)
            push(int(src.line().rstrip(b"L")))
            self.used += _INT
        elif op == 0x46:  # F FLOAT (text)
            push(float(src.line()))
            self.used += _FLOAT
        elif op == 0x53:  # S STRING (a quoted Python 2 str)
            line = src.line().rstrip()
            if len(line) < 2 or line[0] != line[-1] or line[:1] not in (b"'", b'"'):
                raise PickleRefused("damaged pickle: STRING without quotes")
            push(self._text(codecs.escape_decode(line[1:-1])[0], "ascii"))
        elif op == 0x56:  # V UNICODE (raw-unicode-escape text)
            push(self._text(src.line(), "raw_unicode_escape"))
        elif op == 0x95:  # FRAME: a length prefix this reader does not need
            src.take(8)
        elif op == 0x80:  # PROTO
            if src.take(1)[0] > 5:
                raise PickleRefused("unsupported pickle protocol")
        elif op in _REFUSED_OPS:
            raise RefusedGlobal(
                f"refused {self._what_is_asked(op)}: only plain containers and scalars are accepted"
            )
        else:
            raise PickleRefused(f"damaged pickle: unknown opcode 0x{op:02x} at byte {src.consumed + pos}")

    def _what_is_asked(self, op: int) -> str:
        """The global a GLOBAL or STACK_GLOBAL names ('to load os.system'), else the opcode's name."""
        if op == ord("c"):
            module, name = self.src.line(), self.src.line()
            return f"to load {_shown(module.decode('utf-8', 'replace'))}.{_shown(name.decode('utf-8', 'replace'))}"
        if op == 0x93 and len(self.stack) >= 2 and all(type(x) is str for x in self.stack[-2:]):
            return f"to load {_shown(self.stack[-2])}.{_shown(self.stack[-1])}"
        return _REFUSED_OPS[op]

    def _reserve(self, n: int) -> None:
        """Refuse a length prefix before its bytes are read when they alone pass the budget."""
        if self.used + n > self.max_bytes:
            self.used += n
            self._over()

    def _take_sized(self, n: int) -> bytes:
        self._reserve(n)
        return self.src.take(n)


def _shown(name: str) -> str:
    """A name read from the pickle, as an error message may hold it: 200 characters at most, control and
    non-ASCII characters escaped (the message stays one line)."""
    return ascii(name[:200])[1:-1]
