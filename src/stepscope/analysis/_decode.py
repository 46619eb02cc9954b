"""Decode one Kineto chrome-trace file into columns (the per-file half of the loader; see loader.py).

Each file is decoded by msgspec into typed Structs that name only the fields the table keeps (everything
else is skipped while parsing), with the garbage collector paused; columns are then built with numpy from
one list comprehension per field, never a dict per event.

Precision: `ts` is read from its JSON text and converted to integer ns exactly (see `_numparse`); `dur`
is read as a float and rounded to the ns, which is exact for durations under ~25 days written with at most
three decimals (Kineto's format).
"""

from __future__ import annotations

import gc
import gzip
import operator
import zlib
from collections.abc import Iterator, Sequence
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

_Args = msgspec.defstruct(
    "_Args",
    [(attr, Any, msgspec.field(default=None, name=key)) for attr, key in _ARG_FIELDS.items()],
    frozen=True,
)
_NO_ARGS = _Args()


class _Event(msgspec.Struct):
    ph: str = ""
    name: str | None = ""
    cat: str | None = None
    pid: int | float | str | None = None
    tid: int | float | str | None = None
    ts: msgspec.Raw = _EMPTY  # the JSON text: converted to ns exactly, see _numparse
    dur: int | float | None = None
    id: int | float | str | None = None
    args: _Args | None = None  # type: ignore[valid-type]


class _Trace(msgspec.Struct):
    traceEvents: list[_Event]
    distributedInfo: Any = None
    deviceProperties: Any = None
    schemaVersion: Any = None
    baseTimeNanoseconds: Any = None


_DECODER = msgspec.json.Decoder(_Trace)


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
    if not data.strip():
        raise InputError(path, "empty file")
    try:
        trace: _Trace = _DECODER.decode(data)
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


def load_file(path: str | Path, rank_hint: int | None = None) -> FileTable:
    """Decode one trace file into columns with local symbol tables (the unit of work of the pool)."""
    p = Path(path)
    data = _read_json_bytes(p)
    with _gc_paused():
        trace = _decode(p, data)
        del data
        return _build(p, trace, rank_hint)


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
    if types <= {type(None)}:
        return np.full(len(values), MISSING, dtype=np.int64)
    if types <= {int, type(None)}:
        fast = values if type(None) not in types else [MISSING if v is None else v for v in values]
    else:
        convert = _id_as_int if ids else _as_int
        try:  # few distinct non-int values (string tids of old traces): convert each once
            cache = {v: convert(v) for v in set(values) if type(v) is not int}
            fast = [v if type(v) is int else cache[v] for v in values]
        except (TypeError, KeyError):  # unhashable values, or 1 / 1.0 / True sharing a hash
            fast = [v if type(v) is int else convert(v) for v in values]
    try:
        return np.array(fast, dtype=np.int64)
    except OverflowError:
        return np.array([_as_int(v) for v in fast], dtype=np.int64)


def _ns_from_us(values: Sequence[Any]) -> np.ndarray:
    """dur: microseconds -> int64 ns; absent, invalid or out of int64 -> 0.

    All-integer columns are exact; with floats present the column goes through float64 (exact below
    2^53 ns, ~104 days, for values with at most three decimals).
    """
    if float not in set(map(type, values)):
        us = _int_column(values)
        ok = (us != MISSING) & (np.abs(us) <= _MAX_US)
        return np.where(ok, us * 1000, 0)
    try:
        floats = np.array(values, dtype=np.float64)  # None -> nan
    except OverflowError:  # an int beyond float range
        floats = np.array([v if v is None or abs(v) < 9e15 else np.nan for v in values], dtype=np.float64)
    floats = np.where(np.isfinite(floats) & (np.abs(floats) < 9e15), floats, 0.0)
    return np.rint(floats * 1000.0).astype(np.int64)


_MAX_US = (2**63 - 1) // 1000


def _valid_ph(ph: str) -> bool:
    return len(ph) == 1 and ph != "M" and ph.isascii()


def _build(path: Path, trace: _Trace, rank_hint: int | None) -> FileTable:
    info = RankInfo(rank=MISSING, source=str(path))
    _read_header(info, trace)
    events = trace.traceEvents
    phs = list(map(operator.attrgetter("ph"), events))
    kinds = set(phs)
    if "M" in kinds:
        for e in events:
            if e.ph == "M":
                _read_metadata(info, e)
    good = {ph for ph in kinds if _valid_ph(ph)}
    rows = events if good == kinds else [e for e, ph in zip(events, phs, strict=True) if ph in good]
    del phs
    names: dict[str, int] = {}
    cats: dict[str, int] = {}
    cols: dict[str, np.ndarray] = {}
    # One comprehension per field: the cheapest way to read Struct attributes (no per-event dicts).
    ph = np.fromiter(map(ord, [e.ph for e in rows]), dtype=np.uint8, count=len(rows))
    cols["ph"] = ph
    cols["name"] = _intern([e.name for e in rows], names, none="")
    raw_cats: dict[str, int] = {}
    raw_cat_codes = _intern([e.cat for e in rows], raw_cats)
    # Old (2021) categories map onto the current ones; two raw names may become one.
    remap = np.array([cats.setdefault(OLD_CATEGORIES.get(c, c), len(cats)) for c in raw_cats] + [MISSING])
    cols["cat"] = remap[raw_cat_codes].astype(np.int32)
    is_gpu = np.isin(cols["cat"], [i for c, i in cats.items() if c in GPU_CATEGORIES])
    cols["pid"] = _int_column([e.pid for e in rows], ids=True)
    cols["tid"] = _int_column([e.tid for e in rows], ids=True)
    try:
        cols["ts"] = us_texts_to_ns([e.ts for e in rows])
    except NotANumber as exc:
        raise InputError(path, f"wrong field type: `ts` of event {exc.index} is {exc.text[:30]!r}") from None
    cols["dur"] = np.maximum(_ns_from_us([e.dur for e in rows]), 0)
    is_flow = (ph == ord("s")) | (ph == ord("f"))
    cols["flow_id"] = np.where(is_flow, _int_column([e.id for e in rows]), MISSING)
    args: list[Any] = [e.args or _NO_ARGS for e in rows]
    cols["stream"] = np.where(is_gpu, _int_column([a.stream for a in args]), MISSING)
    device = _int_column([a.device for a in args])
    cols["device"] = np.where(is_gpu & (np.abs(device) < 2**31), device, MISSING).astype(np.int32)
    cols["correlation"] = _int_column([a.correlation for a in args])
    external = [a.external_id for a in args]
    if None in external:  # the 2021 schema writes "external id" on runtime calls and GPU activities
        external = [a.external_id_old if x is None else x for a, x in zip(args, external, strict=True)]
    cols["external_id"] = _int_column(external)
    cols["bytes"] = _int_column([a.bytes for a in args])
    for key in STRING_ARGS:
        cols["args_" + key] = _intern(_as_str(list(map(operator.attrgetter(f"s_{key}"), args))), names)
    for key in INT_ARGS:
        cols["args_" + key] = _int_column(list(map(operator.attrgetter(f"i_{key}"), args)))
    declared = info.rank if info.rank != MISSING else rank_hint
    return FileTable(str(path), list(names), list(cats), cols, info, declared)


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
