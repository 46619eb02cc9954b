"""Decode one Kineto chrome-trace file into columns (the per-file half of the loader; see loader.py).

Each file is decoded by msgspec into typed Structs that name only the fields the table keeps (everything
else is skipped while parsing), with the garbage collector paused; columns are then built with numpy from
one list comprehension per field, never a dict per event.

Precision: times become integer ns, exactly for what Kineto writes (microseconds with up to three decimals).
Integers are multiplied by 1000. Floats below 2^43 us (~100 days: durations, relative timestamps) are
recovered exactly from float64 (see _floats_to_ns). Float timestamps beyond that (epoch microseconds with a
ns fraction, which float64 holds only to ~0.25 us) are read as JSON text and converted digit by digit
(_numparse): in the same pass when the start of the file shows them, else in a second, ts-only pass.
"""

from __future__ import annotations

import gc
import gzip
import operator
import re
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from stepscope.analysis._numparse import NotANumber, us_texts_to_ns
from stepscope.analysis.table import (
    GPU_CATEGORIES,
    INT_ARGS,
    MISSING,
    OLD_CATEGORIES,
    STRING_ARGS,
    RankInfo,
    _as_int,
    _id_as_int,
)
from stepscope.errors import InputError

_EMPTY = msgspec.Raw(b"")

# args keys -> attribute of _Args. Keys with spaces need renaming; the table's arg lists drive the rest.
_ARG_FIELDS: dict[str, str] = {
    "stream": "stream",
    "device": "device",
    "correlation": "correlation",
    "external_id": "External id",
    "external_id_old": "external id",
    "bytes": "bytes",
    "meta_name": "name",  # process_name / thread_name metadata events
    **{f"s_{key}": arg for key, arg in STRING_ARGS.items()},
    **{f"i_{key}": arg for key, arg in INT_ARGS.items()},
}

# Integer fields default to -1 (what an absent value becomes), so that most columns hold only ints and go
# to numpy in one call. Fields whose absence must be told apart from a value keep None.
_NONE_DEFAULT = {"external_id", "external_id_old", "meta_name", *(f"s_{key}" for key in STRING_ARGS)}
_Args = msgspec.defstruct(
    "_Args",
    [
        (attr, Any, msgspec.field(default=None if attr in _NONE_DEFAULT else MISSING, name=key))
        for attr, key in _ARG_FIELDS.items()
    ],
    frozen=True,
    gc=False,
)
_NO_ARGS = _Args()


class _Event(msgspec.Struct, gc=False):
    ph: str = ""
    name: str | None = ""
    cat: str | None = None
    pid: int | float | str | None = MISSING
    tid: int | float | str | None = MISSING
    ts: int | float | None = None
    dur: int | float | None = None
    id: int | float | str | None = MISSING
    args: _Args | None = _NO_ARGS  # type: ignore[valid-type]


class _Trace(msgspec.Struct):
    traceEvents: list[_Event]
    distributedInfo: Any = None
    deviceProperties: Any = None
    schemaVersion: Any = None
    baseTimeNanoseconds: Any = None


class _TextTsEvent(_Event, gc=False):
    ts: msgspec.Raw = _EMPTY  # type: ignore[assignment]  # the JSON text, converted exactly by _numparse


class _TextTsTrace(_Trace):
    traceEvents: list[_TextTsEvent]  # type: ignore[assignment]


class _TsOnly(msgspec.Struct, gc=False):
    ts: msgspec.Raw = _EMPTY


class _TsOnlyTrace(msgspec.Struct, gc=False):
    traceEvents: list[_TsOnly]


_DECODER = msgspec.json.Decoder(_Trace)
_TEXT_TS_DECODER = msgspec.json.Decoder(_TextTsTrace)
_TS_ONLY_DECODER = msgspec.json.Decoder(_TsOnlyTrace)
# Float timestamps of 10^13 us and more (epoch microseconds with a ns fraction) cannot go through float64.
_EPOCH_FLOAT_TS = re.compile(rb'"ts"\s*:\s*-?\d{14,}\.\d')
_SNIFF_BYTES = 1 << 16


@dataclass
class FileTable:
    """One file's columns with its own symbol tables (merged into the TraceTable afterwards)."""

    path: str
    names: list[str]
    cats: list[str]
    columns: dict[str, np.ndarray]
    info: RankInfo
    declared_rank: int | None
    notices: list[str] = field(default_factory=list)


# --- reading and decoding one file --------------------------------------------------------------------
def _read_json_bytes(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
    if data[:2] != b"\x1f\x8b":
        return data
    try:
        return gzip.decompress(data)
    except EOFError:
        raise InputError(path, "truncated gzip file") from None
    except (OSError, zlib.error) as exc:
        raise InputError(path, f"corrupt gzip data ({exc})") from None


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Millions of small objects are created and freed at once: the cyclic GC would only rescan them."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _decode(path: Path, data: bytes) -> _Trace:
    """Decode with the typed Structs; `ts` is kept as JSON text when the start of the file shows float
    timestamps that float64 would round (otherwise _build may still need a second, ts-only pass)."""
    if not data or data.isspace():
        raise InputError(path, "empty file")
    decoder = _TEXT_TS_DECODER if _EPOCH_FLOAT_TS.search(data, 0, _SNIFF_BYTES) else _DECODER
    try:
        trace: _Trace = decoder.decode(data)
    except msgspec.ValidationError as exc:
        message = str(exc)
        if "missing required field `traceEvents`" in message:
            raise InputError(path, "JSON without traceEvents: not a chrome trace") from None
        if " - at `$" not in message:  # msgspec names no location for the top level
            raise InputError(path, "not a chrome trace: the top level is not a JSON object") from None
        raise InputError(path, f"wrong field type: {message}") from None
    except msgspec.DecodeError as exc:
        message = str(exc)
        if "truncated" in message:
            raise InputError(path, "truncated JSON") from None
        raise InputError(path, f"not valid JSON ({message})") from None
    except UnicodeDecodeError as exc:  # a string that is not UTF-8
        raise InputError(path, f"not valid JSON (bad UTF-8 at byte {exc.start} of a string)") from None
    return trace


def load_file(
    path: str | Path, rank_hint: int | None = None, progress: Callable[[float], None] | None = None
) -> FileTable:
    """Decode one trace file into columns with local symbol tables (the unit of work of the pool).

    `progress(fraction)` is called between the phases (read, decode, build): a long decode cannot report
    from inside msgspec."""
    report = progress or (lambda fraction: None)
    p = Path(path)
    report(0.0)
    data = _read_json_bytes(p)
    report(0.2)
    with _gc_paused():
        trace = _decode(p, data)
        report(0.6)
        table = _build(p, trace, rank_hint, data)
    report(1.0)
    return table


# --- building the columns -----------------------------------------------------------------------------
def _intern(values: Sequence[str | None], table: dict[str, int], none: str | None = None) -> np.ndarray:
    """Codes of `values` in `table` (extended in first-seen order); None -> code of `none`, or -1."""
    lookup: dict[str | None, int] = {}
    for value in dict.fromkeys(values):
        if value is None:
            lookup[None] = MISSING if none is None else table.setdefault(none, len(table))
        else:
            if type(value) is not str:
                raise TypeError(value)
            lookup[value] = table.setdefault(value, len(table))
    return np.fromiter(map(lookup.__getitem__, values), dtype=np.int32, count=len(values))


def _as_str(values: Sequence[Any]) -> Sequence[str | None]:
    """String args as the reference builder stores them: str() of anything not None."""
    if set(map(type, values)) <= {str, type(None)}:
        return values
    return [v if v is None or type(v) is str else str(v) for v in values]


def _int_column(values: Sequence[Any], *, ids: bool = False) -> np.ndarray:
    """int64 column; non-ints (and ints beyond int64) become -1. `ids`: parse numeric strings too."""
    types = set(map(type, values))
    if types <= {int, type(None)}:
        try:
            return np.array(
                values if type(None) not in types else [MISSING if v is None else v for v in values],
                dtype=np.int64,
            )
        except OverflowError:
            pass
    convert = _id_as_int if ids else _as_int
    try:  # few distinct non-int values (the string tids of 2021 traces): convert each once
        cache = {v: convert(v) for v in set(values) if type(v) is not int}
        fast = [v if type(v) is int else cache[v] for v in values]
    except (TypeError, KeyError):  # unhashable args values, or 1 and 1.0 sharing a hash
        fast = [v if type(v) is int else convert(v) for v in values]
    try:
        return np.array(fast, dtype=np.int64)
    except OverflowError:
        return np.array([_as_int(v) for v in fast], dtype=np.int64)


def _sparse_int_column(n: int, at: np.ndarray, values: Sequence[Any]) -> np.ndarray:
    """A column of -1 with `values` at rows `at`."""
    out = np.full(n, MISSING, dtype=np.int64)
    out[at] = _int_column(values)
    return out


def _ns_from_us(values: Sequence[Any]) -> tuple[np.ndarray, bool]:
    """int64 ns from microseconds (ints, floats or None); absent or out of int64 -> 0.

    The flag says that float64 could not give the exact value: a float of 2^43 us or more with a fraction.
    """
    if float not in set(map(type, values)):
        ints = [0 if v is None else v for v in values]
        try:
            us = np.array(ints, dtype=np.int64)
        except OverflowError:
            us = np.array([v if -_MAX_US <= v <= _MAX_US else 0 for v in ints], dtype=np.int64)
        return np.where(np.abs(us) <= _MAX_US, us * 1000, 0), False
    try:
        floats = np.array(values, dtype=np.float64)  # None -> nan
    except OverflowError:  # an int beyond float range
        floats = np.array([v if v is None or abs(v) < 9e15 else np.nan for v in values], dtype=np.float64)
    return _floats_to_ns(floats)


_MAX_US = (2**63 - 1) // 1000


def _floats_to_ns(us: np.ndarray) -> tuple[np.ndarray, bool]:
    """Below 2^43 us a float64 lies within 0.5 ulp < 0.5 ns of the decimal it was parsed from, so the
    decimal with three places is the one whose float64 is the value (texts with more places get the ns
    nearest the float). From 2^43 us on, several decimals share a float: the flag asks for the text
    (timestamps get it; a duration of over 100 days keeps the nearest ns of its float)."""
    out = np.zeros(len(us), dtype=np.int64)
    magnitude = np.abs(us)  # nan (null) compares False: stays 0
    small = magnitude < 2.0**43
    x = us[small]
    nearest = np.rint(x * 1000.0)
    best = nearest.copy()
    found = nearest / 1000.0 == x
    for step in (-1.0, 1.0):
        candidate = nearest + step
        match = ~found & (candidate / 1000.0 == x)
        best[match] = candidate[match]
        found |= match
    out[small] = best.astype(np.int64)
    big = (magnitude >= 2.0**43) & (magnitude < 9e15)  # nearest ns of the float: up to ~0.25 us off
    out[big] = np.rint(us[big] * 1000.0).astype(np.int64)
    return out, bool(big.any())


def _exact_ts(data: bytes) -> np.ndarray:
    """Timestamps of all events from their JSON text (a second pass, when the first could not be exact)."""
    return us_texts_to_ns([r.ts for r in _TS_ONLY_DECODER.decode(data).traceEvents])


# ph -> its code in the table, 0 for what the table leaves out ('M' metadata, anything not one ASCII char).
def _ph_code(ph: str) -> int:
    return ord(ph) if len(ph) == 1 and ph != "M" and ph.isascii() else 0


_RARE_FIELDS = (*(f"s_{k}" for k in STRING_ARGS), *(f"i_{k}" for k in INT_ARGS))
_get_rare = operator.attrgetter(*_RARE_FIELDS)
_NO_RARE = _get_rare(_NO_ARGS)


def _build(path: Path, trace: _Trace, rank_hint: int | None, data: bytes) -> FileTable:
    """Columns of one file. One list comprehension per field (the cheapest way to read Struct attributes;
    never a dict per event); rows the table leaves out are dropped at the end with a mask."""
    info = RankInfo(rank=MISSING, source=str(path))
    _read_header(info, trace)
    events = trace.traceEvents
    n = len(events)
    phs = [e.ph for e in events]
    codes = {ph: _ph_code(ph) for ph in set(phs)}
    ph = np.fromiter(map(codes.__getitem__, phs), dtype=np.uint8, count=n)
    del phs
    if "M" in codes:
        for i in np.flatnonzero(ph == 0).tolist():
            if events[i].ph == "M":
                _read_metadata(info, events[i])
    names: dict[str, int] = {}
    cats: dict[str, int] = {}
    cols: dict[str, np.ndarray] = {"ph": ph}
    cols["name"] = _intern([e.name for e in events], names, none="")
    raw_cats: dict[str, int] = {}
    raw_cat_codes = _intern([e.cat for e in events], raw_cats)
    # Old (2021) categories map onto the current ones; two raw names may become one.
    remap = np.array([cats.setdefault(OLD_CATEGORIES.get(c, c), len(cats)) for c in raw_cats] + [MISSING])
    cols["cat"] = remap[raw_cat_codes].astype(np.int32)
    cols["pid"] = _int_column([e.pid for e in events], ids=True)
    cols["tid"] = _int_column([e.tid for e in events], ids=True)
    timestamps = [e.ts for e in events]
    if isinstance(trace, _TextTsTrace):
        try:
            cols["ts"] = us_texts_to_ns(timestamps)
        except NotANumber as exc:
            raise InputError(
                path, f"wrong field type: `ts` of event {exc.index} is {exc.text[:30]!r}"
            ) from None
    else:
        cols["ts"], inexact = _ns_from_us(timestamps)
        if inexact:
            cols["ts"] = _exact_ts(data)
    del timestamps
    cols["dur"] = np.maximum(_ns_from_us([e.dur for e in events])[0], 0)
    flows = np.flatnonzero((ph == ord("s")) | (ph == ord("f")))
    cols["flow_id"] = _sparse_int_column(n, flows, [events[i].id for i in flows.tolist()])
    args: list[Any] = [e.args for e in events]
    if None in args:  # "args": null
        args = [a or _NO_ARGS for a in args]
    gpu = np.flatnonzero(np.isin(cols["cat"], [i for c, i in cats.items() if c in GPU_CATEGORIES]))
    gpu_args = [args[i] for i in gpu.tolist()]
    cols["stream"] = _sparse_int_column(n, gpu, [a.stream for a in gpu_args])
    device = _sparse_int_column(n, gpu, [a.device for a in gpu_args])
    cols["device"] = np.where(np.abs(device) < 2**31, device, MISSING).astype(np.int32)
    cols["correlation"] = _int_column([a.correlation for a in args])
    cols["bytes"] = _int_column([a.bytes for a in args])
    external = [a.external_id for a in args]
    old = [a.external_id_old for a in args]
    if old.count(None) != n:  # the 2021 schema writes "external id" on runtime calls and GPU activities
        external = [o if x is None else x for x, o in zip(external, old, strict=True)]
    cols["external_id"] = _int_column(external)
    _rare_columns(cols, args, names)
    keep = ph != 0
    if not keep.all():
        cols = {key: column[keep] for key, column in cols.items()}
    declared = info.rank if info.rank != MISSING else rank_hint
    return FileTable(str(path), list(names), list(cats), cols, info, declared)


def _rare_columns(cols: dict[str, np.ndarray], args: list[Any], names: dict[str, int]) -> None:
    """The args of collectives (record_param_comms), which few events carry: read only where present."""
    n = len(args)
    values = list(map(_get_rare, args))
    rare = [] if values.count(_NO_RARE) == n else [i for i, v in enumerate(values) if v != _NO_RARE]
    at = np.array(rare, dtype=np.int64)
    by_field = list(zip(*(values[i] for i in rare), strict=True)) if rare else [()] * len(_RARE_FIELDS)
    fields = dict(zip(_RARE_FIELDS, by_field, strict=True))
    for key in STRING_ARGS:
        column = np.full(n, MISSING, dtype=np.int32)
        column[at] = _intern(_as_str(fields[f"s_{key}"]), names)
        cols["args_" + key] = column
    for key in INT_ARGS:
        cols["args_" + key] = _sparse_int_column(n, at, fields[f"i_{key}"])


def _read_header(info: RankInfo, trace: _Trace) -> None:
    dist = trace.distributedInfo if isinstance(trace.distributedInfo, dict) else {}
    rank = dist.get("rank")
    if type(rank) is int and 0 <= rank < 2**31:
        info.rank = rank
    world = dist.get("world_size")
    info.world_size = world if type(world) is int else None
    backend = dist.get("backend")
    info.backend = backend if isinstance(backend, str) else None
    props = trace.deviceProperties
    info.device_properties = [d for d in props if isinstance(d, dict)] if isinstance(props, list) else []
    info.schema_version = trace.schemaVersion if type(trace.schemaVersion) is int else None
    base = trace.baseTimeNanoseconds
    info.base_time_ns = base if type(base) is int else None


def _read_metadata(info: RankInfo, event: _Event) -> None:
    value = event.args.meta_name if event.args is not None else None
    if not isinstance(value, str):
        return
    if event.name == "process_name":
        info.process_names[_id_as_int(event.pid)] = value
    elif event.name == "thread_name":
        info.thread_names[(_id_as_int(event.pid), _id_as_int(event.tid))] = value
