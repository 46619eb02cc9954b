"""Numpy columns from the fields of decoded events (see _columns): phases, symbol codes, ids, integer args
and times in integer ns, each read in one pass over a chunk's values with the fewest type checks its decoder
allows (a strict decoder's fields hold ints where ints are expected)."""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import Any

import numpy as np

from stepscope.analysis.read.table import INT_ARGS, MISSING, OUT_OF_RANGE_NS, STRING_ARGS, as_int

MAX_US = (2**63 - 1) // 1000
UNSEEN = -2  # code of a symbol not in the lookup yet (real codes are >= -1)
BYTE_UNSEEN = 255  # the same, where codes are read as bytes

# By ord() of a phase letter: True for phases the table leaves out ('M' metadata; flows 's' 'f' when asked).
LEFT_OUT = np.zeros(256, dtype=bool)
LEFT_OUT[ord("M")] = True
LEFT_OUT_WITH_FLOWS = LEFT_OUT.copy()
LEFT_OUT_WITH_FLOWS[[ord("s"), ord("f")]] = True


def ph_column(phs: list[str], left_out: np.ndarray = LEFT_OUT) -> np.ndarray:
    """ord() of one-letter ASCII phases; 0 for what the table leaves out (`left_out`, and anything that is
    not one ASCII letter)."""
    joined = "".join(phs)
    if len(joined) == len(phs) and joined.isascii():  # (then every phase is one letter)
        codes = np.frombuffer(joined.encode("ascii"), dtype=np.uint8)
        return np.where(left_out[codes], np.uint8(0), codes)
    lookup = {p: ord(p) if len(p) == 1 and p.isascii() and not left_out[ord(p)] else 0 for p in set(phs)}
    return np.fromiter(map(lookup.__getitem__, phs), dtype=np.uint8, count=len(phs))


def codes_of(values: list[Any], lookup: dict[Any, int], add: Callable[[Any], int], dtype: type) -> np.ndarray:
    """`lookup[v]` of every value; values not in `lookup` yet get `add(v)` (first-seen order)."""
    n = len(values)
    codes: np.ndarray | None = None
    if len(lookup) < BYTE_UNSEEN:  # codes of a small lookup fit a byte: bytes() takes them 3x cheaper
        with contextlib.suppress(ValueError):  # (a code beyond a byte, or -1)
            as_bytes = bytes(map(lookup.get, values, repeat(BYTE_UNSEEN)))
            codes = np.frombuffer(as_bytes, dtype=np.uint8).astype(dtype)
            codes[codes == BYTE_UNSEEN] = UNSEEN  # (a real code 255 is looked up again below: harmless)
    if codes is None:
        codes = np.fromiter(map(lookup.get, values, repeat(UNSEEN)), dtype=dtype, count=n)
    unseen = np.flatnonzero(codes == UNSEEN)
    if len(unseen):
        new = values if len(unseen) == n else [values[i] for i in unseen.tolist()]
        for value in dict.fromkeys(new):
            lookup[value] = add(value)
        codes[unseen] = np.fromiter(map(lookup.__getitem__, new), dtype=dtype, count=len(new))
    return codes


def as_str(values: Sequence[Any]) -> Sequence[str | None]:
    """String args as the reference builder stores them: str() of anything not None."""
    if set(map(type, values)) <= {str, type(None)}:
        return values
    return [v if v is None or type(v) is str else str(v) for v in values]


def int_column(values: Sequence[Any], *, strict: bool) -> np.ndarray:
    """int64 column; non-ints (and ints beyond int64) become -1. `strict`: the values are all ints."""
    if strict:
        try:
            return np.fromiter(values, dtype=np.int64, count=len(values))
        except OverflowError:
            return np.array([as_int(v) for v in values], dtype=np.int64)
    types = set(map(type, values))
    if types <= {int, type(None)}:
        with contextlib.suppress(OverflowError):
            ints = values if type(None) not in types else [MISSING if v is None else v for v in values]
            return np.fromiter(ints, dtype=np.int64, count=len(values))
    try:  # few distinct non-int values: convert each once
        cache = {v: as_int(v) for v in set(values) if type(v) is not int}
        fast = [v if type(v) is int else cache[v] for v in values]
    except (TypeError, KeyError):  # unhashable args values, or 1 and 1.0 sharing a hash
        fast = [v if type(v) is int else as_int(v) for v in values]
    try:
        return np.fromiter(fast, dtype=np.int64, count=len(fast))
    except OverflowError:
        return np.array([as_int(v) for v in fast], dtype=np.int64)


def strict_all_ints(values: list[Any]) -> bool:
    """For values of a strict Struct field (ints, and floats or strings; never None or bools): True when all
    are ints. sum() stays an int over ints only (a float makes it a float, a string raises; so does an int
    beyond float range next to a float) in one C loop, several times cheaper than collecting the types."""
    try:
        return type(sum(values)) is int
    except (TypeError, OverflowError):
        return False


def ns_from_us(values: list[Any], *, strict: bool = False) -> tuple[np.ndarray, bool]:
    """int64 ns from microseconds (ints, floats or None); absent or out of int64 -> 0. `strict`: the values
    come from a strict Struct field (ints and floats only).

    The flag says that float64 could not give the exact value: a float of 2^43 us or more with a fraction.
    """
    n = len(values)
    types: set[type]
    if strict and strict_all_ints(values):
        types = {int}
    else:
        if strict:  # floats, maybe with ints: all read as floats (an int beyond float range: below)
            with contextlib.suppress(OverflowError):
                return floats_to_ns(np.fromiter(values, dtype=np.float64, count=n))
        types = set(map(type, values))
    if float not in types:
        ints = values if type(None) not in types else [0 if v is None else v for v in values]
        try:
            us = np.fromiter(ints, dtype=np.int64, count=n)
        except OverflowError:
            us = np.array([v if -MAX_US <= v <= MAX_US else 0 for v in ints], dtype=np.int64)
        return np.where(np.abs(us) <= MAX_US, us * 1000, 0), False
    if types == {float}:
        return floats_to_ns(np.fromiter(values, dtype=np.float64, count=n))
    try:
        floats = np.array(values, dtype=np.float64)  # None -> nan
    except OverflowError:  # an int beyond float range
        floats = np.array([v if v is None or abs(v) < 9e15 else np.nan for v in values], dtype=np.float64)
    return floats_to_ns(floats)


def floats_to_ns(us: np.ndarray) -> tuple[np.ndarray, bool]:
    """Below 2^43 us a float64 lies within 0.5 ulp < 0.5 ns of the decimal it was parsed from, so the
    decimal with three places is the one whose float64 is the value (texts with more places get the ns
    nearest the float). From 2^43 us on, several decimals share a float: the flag asks for the text
    (timestamps get it; a duration of over 100 days keeps the nearest ns of its float)."""
    magnitude = np.abs(us)  # nan (null) compares False: stays 0
    small = magnitude < 2.0**43
    x = us if small.all() else us[small]
    nearest = np.rint(x * 1000.0)
    found = nearest / 1000.0 == x
    if not found.all():
        best = nearest.copy()
        for step in (-1.0, 1.0):
            candidate = nearest + step
            match = ~found & (candidate / 1000.0 == x)
            best[match] = candidate[match]
            found |= match
        nearest = best
    if x is us:
        return nearest.astype(np.int64), False
    out = np.zeros(len(us), dtype=np.int64)
    out[small] = nearest.astype(np.int64)
    big = (magnitude >= 2.0**43) & (magnitude < 9e15)  # nearest ns of the float: up to ~0.25 us off
    out[big] = np.rint(us[big] * 1000.0).astype(np.int64)
    huge = magnitude >= 9e15  # beyond int64 ns (or near it): marked, and the loader refuses the file
    out[huge] = np.where(us[huge] > 0, OUT_OF_RANGE_NS, -OUT_OF_RANGE_NS)
    return out, bool(big.any())


# Args of collectives, by attribute of the decoded args Struct (see _decode), and their defaults.
RARE_FIELDS = (*(f"s_{k}" for k in STRING_ARGS), *(f"i_{k}" for k in INT_ARGS))
get_rare = operator.attrgetter(*RARE_FIELDS)
NO_RARE = tuple(None for _ in RARE_FIELDS)  # absent: None (an explicit null reads the same)


def rare_rows(args: list[Any]) -> list[int]:
    """Rows whose args hold any of RARE_FIELDS (a chain of identity tests: ~3x faster than a tuple each)."""
    return [
        i
        for i, a in enumerate(args)
        if a.s_collective is not None
        or a.s_dtype is not None
        or a.s_pg_name is not None
        or a.s_pg_desc is not None
        or a.s_pg_ranks is not None
        or a.s_in_split is not None
        or a.s_out_split is not None
        or a.i_in_nelems is not None
        or a.i_out_nelems is not None
        or a.i_group_size is not None
    ]


_RARE_TESTED = (
    "s_collective",
    "s_dtype",
    "s_pg_name",
    "s_pg_desc",
    "s_pg_ranks",
    "s_in_split",
    "s_out_split",
)
if (*_RARE_TESTED, "i_in_nelems", "i_out_nelems", "i_group_size") != RARE_FIELDS:
    raise AssertionError("rare_rows must test every field of RARE_FIELDS")
