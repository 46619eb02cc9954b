"""Exact microsecond -> nanosecond conversion of JSON number texts, vectorised with numpy.

Kineto writes timestamps as epoch microseconds with a nanosecond fraction (`1712195495519689.047`). A
float64 holds such a value only to ~0.25 us, so the loader keeps the raw JSON text of `ts`/`dur`
(`msgspec.Raw`) and parses the decimal digits here: exact to the ns; a longer fraction is rounded half to
even. Texts this fast path does not cover (exponents, more than 16 integer digits, very long texts) go
through `decimal.Decimal`, with the same result.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal, InvalidOperation

import msgspec
import numpy as np

from stepscope.analysis.read.table import decimal_us_to_ns

_CHUNK = 1 << 16  # rows per vectorised block: bounds the temporaries to a few MB
_INT64_MAX = np.uint64(2**63 - 1)
_ZERO, _NINE, _DOT, _MINUS, _COMMA = 48, 57, 46, 45, 44


class NotANumber(ValueError):
    """Raised with the index of the first value that is a JSON string, bool, array or object."""

    def __init__(self, index: int, text: bytes) -> None:
        self.index = index
        self.text = text
        super().__init__(f"value {index}: {text[:40]!r}")


def us_texts_to_ns(texts: Sequence[msgspec.Raw]) -> np.ndarray:
    """int64 ns from the JSON texts of microsecond values (`msgspec.Raw`).

    An empty text (field absent) or `null` gives 0, like a value out of int64. Raises NotANumber on a
    JSON value that is not a number.
    """
    n = len(texts)
    out = np.zeros(n, dtype=np.int64)
    if n == 0:
        return out
    # One JSON array of all the texts, written by msgspec in C: numbers hold no comma, so the commas
    # delimit them (a text with a comma is not a number: the per-text lengths find it for the slow path).
    buf = np.frombuffer(msgspec.json.encode(list(texts)), dtype=np.uint8)
    width = len(texts[0])
    if width and len(buf) == n * (width + 1) + 1 and (buf[width + 1 : -1 : width + 1] == _COMMA).all():
        # all of one width (commas where they would be): one text per row of a matrix (a view)
        rows = buf[1 : 1 + n * (width + 1)].reshape(n, width + 1)[:, :width]
        for lo in range(0, n, _CHUNK):
            values = _parse_rows(rows[lo : lo + _CHUNK])
            if values is None:
                break
            out[lo : lo + _CHUNK] = values
        else:
            return out
        starts = np.arange(1, len(buf) - 1, width + 1)
        lens = np.full(n, width)
    elif len(commas := np.flatnonzero(buf == _COMMA)) == n - 1:
        starts = np.concatenate(([1], commas + 1))
        lens = np.concatenate((commas, [len(buf) - 1])) - starts
    else:
        lens = np.fromiter(map(len, texts), dtype=np.int64, count=n)
        buf = np.frombuffer(b"".join(texts), dtype=np.uint8)
        starts = np.cumsum(lens) - lens
    if not lens.any():
        return out
    slow = np.zeros(n, dtype=bool)
    for lo in range(0, n, _CHUNK):
        hi = min(lo + _CHUNK, n)
        out[lo:hi], slow[lo:hi] = _parse_block(buf, starts[lo:hi], lens[lo:hi])
    for i in np.flatnonzero(slow).tolist():
        out[i] = _slow(i, bytes(texts[i]))
    return out


# Ns place value of the integer digits (up to 16, i.e. < 10^16 us) and of the 3 fraction digits.
_INT_PLACES = [10 ** (k + 3) for k in range(16)]
_FRAC_PLACES = [100, 10, 1]


def _parse_block(buf: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Values of the texts that are plain decimals (sign, <= 16 integer and <= 3 fraction digits); the
    others are flagged for the Decimal path.

    Rows are grouped by shape (sign, integer digits, fraction digits), of which a trace has few: each group
    is one gather of fixed-width rows, a digit check and one dot product with the place values.
    """
    n = len(lens)
    if n and (lens == lens[0]).all() and (uniform := _parse_uniform(buf, starts, int(lens[0]))) is not None:
        return uniform
    values = np.zeros(n, dtype=np.int64)
    slow = np.zeros(n, dtype=bool)
    rows = np.flatnonzero(lens > 0)
    if len(rows) == 0:
        return values, slow
    start = starts[rows]
    end = start + lens[rows]
    negative = buf[start] == _MINUS
    first_digit = start + negative
    dot = end.copy()
    for frac in (3, 2, 1):  # a dot followed by `frac` characters
        pos = end - frac - 1
        found = (dot == end) & (pos > first_digit) & (buf[np.maximum(pos, 0)] == _DOT)
        dot[found] = pos[found]
    n_int = dot - first_digit
    n_frac = np.maximum(end - dot - 1, 0)
    shape = np.where((n_int >= 1) & (n_int <= 16), negative * 100 + n_int * 4 + n_frac, -1)
    slow[rows[shape < 0]] = True
    order = np.argsort(shape, kind="stable")
    for group in np.split(order, np.flatnonzero(np.diff(shape[order])) + 1):
        key = int(shape[group[0]])
        if key < 0:
            continue
        sign, rest = divmod(key, 100)
        k_int, k_frac = divmod(rest, 4)
        places = [0] * sign + _INT_PLACES[:k_int][::-1] + ([0, *_FRAC_PLACES[:k_frac]] if k_frac else [])
        window = np.lib.stride_tricks.sliding_window_view(buf, len(places))[start[group]]
        digits = window - np.uint8(_ZERO)  # non-digits wrap around to > 9
        weights = np.array(places, dtype=np.uint64)
        ok = (digits[:, weights > 0] <= 9).all(axis=1)
        total = digits.astype(np.uint64) @ weights
        ok &= total <= _INT64_MAX
        if sign:
            total = np.uint64(0) - total  # two's complement: negation in int64 after the view below
        values[rows[group]] = np.where(ok, total, np.uint64(0)).view(np.int64)
        slow[rows[group[~ok]]] = True
    return values, slow


def _parse_uniform(buf: np.ndarray, starts: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray] | None:
    """_parse_block when every text has the same width (see _parse_rows); None when some text has another
    shape (the general path groups them)."""
    values = _parse_rows(np.lib.stride_tricks.sliding_window_view(buf, width)[starts])
    return None if values is None else (values, np.zeros(len(starts), dtype=bool))


def _parse_rows(rows: np.ndarray) -> np.ndarray | None:
    """Values of texts of one width, one per row of a uint8 matrix, when every text has the shape of the
    first: a plain non-negative decimal (the common case: epoch timestamps with three decimals); None when
    some text does not. One dot product with the place values; digit columns that are the same in every row
    (the leading digits of epoch timestamps) are summed once."""
    width = rows.shape[1]
    first = rows[0].tobytes()
    dot = first.find(b".")
    n_int, n_frac = (dot, width - dot - 1) if dot >= 0 else (width, 0)
    if not (1 <= n_int <= 16 and n_frac <= 3 and first.replace(b".", b"", 1).isdigit()):
        return None
    places = np.array(
        _INT_PLACES[:n_int][::-1] + ([0, *_FRAC_PLACES[:n_frac]] if dot >= 0 else []), dtype=np.uint64
    )
    if dot >= 0 and not (rows[:, dot] == _DOT).all():
        return None
    digits = rows - np.uint8(_ZERO)  # non-digits wrap around to > 9
    if dot >= 0:
        digits[:, dot] = 0
    if digits.max() > 9:
        return None
    same = (digits == digits[0]).all(axis=0)
    total = np.full(len(rows), digits[0, same].astype(np.uint64) @ places[same], dtype=np.uint64)
    if not same.all():
        total += digits[:, ~same].astype(np.uint64) @ places[~same]
    if not (total <= _INT64_MAX).all():
        return None
    return total.view(np.int64)


def _slow(index: int, text: bytes) -> int:
    head = text[:1]
    if head == b"n":  # null: absent
        return 0
    if not head or head not in b"-0123456789":
        raise NotANumber(index, text)
    try:
        return decimal_us_to_ns(Decimal(text.decode("ascii")))
    except (InvalidOperation, UnicodeDecodeError, ArithmeticError):
        raise NotANumber(index, text) from None
