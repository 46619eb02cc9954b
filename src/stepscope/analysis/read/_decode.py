"""Typed msgspec decoding of Kineto chrome traces (the Structs, and whole-file decoding with its errors).

Events are decoded into Structs that name only the fields the table keeps (everything else is skipped while
parsing), with the garbage collector paused. Two flavours:

- strict Structs: ints where the table wants ints, strings for names, an args object for args. Almost
  every real trace decodes with them, and their columns need no type scan (see _columns).
- permissive Structs: any JSON value where Kineto writers have been seen to vary (float or string ids,
  null names or args, strings in numeric args). A piece of text the strict Structs reject is decoded again
  with these; what they reject is a wrong field type, reported as such.

Each flavour exists with `ts` as a number and with `ts` as raw JSON text, for epoch timestamps with a ns
fraction that float64 cannot hold (converted exactly by _numparse).

The files are read in chunks by _stream; this module also decodes a whole file at once, the path that
gives every error its message (and the one taken for files the chunked reader cannot split).
"""

from __future__ import annotations

import gc
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from stepscope.analysis.read._columns import Chunk, ColumnBuilder
from stepscope.analysis.read._numparse import NotANumber, us_texts_to_ns
from stepscope.analysis.read._parts import FileTable
from stepscope.analysis.read._text import json_problem
from stepscope.analysis.read._values import NO_RARE, get_rare
from stepscope.analysis.read.table import INT_ARGS, MISSING, RAW_ARGS, STRING_ARGS, SYNC_INT_ARGS, RankInfo
from stepscope.errors import InputError

_EMPTY = msgspec.Raw(b"")
UNSET: Any = msgspec.UNSET

# args keys -> attribute of the args Structs. Keys with spaces need renaming; the table's arg lists drive the rest.
_ARG_FIELDS: dict[str, str] = {
    # read for every event: kept together, at the front of the Struct (fewer cache lines touched)
    "correlation": "correlation",
    "bytes": "bytes",
    **{f"s_{key}": arg for key, arg in STRING_ARGS.items()},
    **{f"i_{key}": arg for key, arg in INT_ARGS.items()},
    # read for some events only
    "stream": "stream",
    "device": "device",
    **{f"w_{key}": arg for key, arg in SYNC_INT_ARGS.items()},
}
# Integer fields default to -1 (what an absent value becomes), so that most columns hold only ints and go
# to numpy in one call. Fields whose absence must be told apart from a value keep None.
_NONE_DEFAULT = {*(f"s_{k}" for k in STRING_ARGS), *(f"i_{k}" for k in INT_ARGS)}
# `bytes` stays Any: it is read on GPU rows only, and some writers put a string there on other events.
_STRICT_INTS = {"stream", "device", "correlation"}


def _args_struct(name: str, *, strict: bool) -> Any:
    def spec(attr: str) -> tuple[Any, Any]:
        if strict and attr in _STRICT_INTS:
            return int, MISSING
        return Any, None if attr in _NONE_DEFAULT else MISSING

    return msgspec.defstruct(
        name,
        [
            (attr, *spec(attr)[:1], msgspec.field(default=spec(attr)[1], name=key))
            for attr, key in _ARG_FIELDS.items()
        ],
        frozen=True,
        gc=False,
    )


_Args = _args_struct("_Args", strict=False)
_StrictArgs = _args_struct("_StrictArgs", strict=True)
_NO_ARGS = _Args()
_NO_STRICT_ARGS = _StrictArgs()
assert get_rare(_NO_ARGS) == get_rare(_NO_STRICT_ARGS) == NO_RARE


class _Event(msgspec.Struct, gc=False):
    ph: str = ""
    name: str | None = ""
    cat: str | None = None
    pid: int | float | str | None = MISSING
    tid: int | float | str | None = MISSING
    ts: int | float | None = None
    dur: int | float | None = None
    args: _Args | None = _NO_ARGS  # type: ignore[valid-type]


class _TextTsEvent(_Event, gc=False):
    ts: msgspec.Raw = _EMPTY  # type: ignore[assignment]  # the JSON text, converted exactly by _numparse


class _StrictEvent(msgspec.Struct, gc=False):
    ph: str = ""
    name: str = ""
    cat: str | None = None
    pid: int | str = MISSING
    tid: int | str = MISSING
    ts: int | float = 0
    dur: int | float = 0
    args: _StrictArgs = _NO_STRICT_ARGS  # type: ignore[valid-type]


class _StrictTextTsEvent(_StrictEvent, gc=False):
    ts: msgspec.Raw = _EMPTY  # type: ignore[assignment]


class _Trace(msgspec.Struct):
    traceEvents: list[_Event]
    distributedInfo: Any = None
    deviceProperties: Any = None
    stepscopeMerge: Any = None


class _TextTsTrace(_Trace):
    traceEvents: list[_TextTsEvent]  # type: ignore[assignment]


class _TsOnly(msgspec.Struct, gc=False):
    ts: msgspec.Raw = _EMPTY


class _TsOnlyTrace(msgspec.Struct, gc=False):
    traceEvents: list[_TsOnly]


# The recorded shapes of events, decoded in a second pass over a chunk's text only when the chunk holds
# backend collective ranges (`gloo:all_reduce`): record_shapes puts them on every op, and keeping them in the
# main Structs would cost every event.
_ShapeArgs = msgspec.defstruct(
    "_ShapeArgs",
    [(key, Any, msgspec.field(default=None, name=arg)) for key, arg in RAW_ARGS.items()],
    frozen=True,
    gc=False,
)
NO_SHAPES = _ShapeArgs()


class _ShapesOnly(msgspec.Struct, gc=False):
    args: _ShapeArgs | None = NO_SHAPES  # type: ignore[valid-type]


class _ShapesOnlyTrace(msgspec.Struct, gc=False):
    traceEvents: list[_ShapesOnly]


HEADER_FIELDS = ("distributedInfo", "deviceProperties", "stepscopeMerge")


def _header_struct(name: str, events: Any) -> Any:
    """The top-level object with `traceEvents` of `events`; header keys are UNSET when absent."""
    return msgspec.defstruct(
        name, [("traceEvents", list[events]), *((key, Any, UNSET) for key in HEADER_FIELDS)]
    )


class EventDecoders:
    """Decoders of one event flavour: a JSON array of events, the text from the array's start to the end of
    the file (`{"traceEvents":[` prepended; header keys after the array come with it), ts-only arrays."""

    def __init__(self, event: Any, *, strict: bool, text_ts: bool) -> None:
        self.strict = strict
        self.text_ts = text_ts
        self.no_args = _NO_STRICT_ARGS if strict else _NO_ARGS
        self.events = msgspec.json.Decoder(list[event])
        self.tail = msgspec.json.Decoder(_header_struct(f"_Tail{event.__name__}", event))

    def chunk(
        self,
        events: list[Any],
        exact_ts: Callable[[], np.ndarray],
        shapes: Callable[[], list[Any]],
    ) -> Chunk:
        return Chunk(events, self.strict, self.text_ts, exact_ts, self.no_args, shapes)


DECODERS = {
    (strict, text_ts): EventDecoders(event, strict=strict, text_ts=text_ts)
    for (strict, text_ts), event in {
        (True, False): _StrictEvent,
        (True, True): _StrictTextTsEvent,
        (False, False): _Event,
        (False, True): _TextTsEvent,
    }.items()
}
HEAD_DECODER = msgspec.json.Decoder(_header_struct("_Head", Any))
_DECODER = msgspec.json.Decoder(_Trace)
_TEXT_TS_DECODER = msgspec.json.Decoder(_TextTsTrace)
_TS_ONLY_DECODER = msgspec.json.Decoder(_TsOnlyTrace)
_TS_ONLY_LIST_DECODER = msgspec.json.Decoder(list[_TsOnly])
# Float timestamps of 10^13 us and more (epoch microseconds with a ns fraction) cannot go through float64.
EPOCH_FLOAT_TS = re.compile(rb'"ts"\s*:\s*-?\d{14,}\.\d')
SNIFF_BYTES = 1 << 16


def exact_ts_of_array(text: bytes) -> np.ndarray:
    """Timestamps of the events of a JSON array, from their JSON text (when float64 cannot hold them)."""
    return us_texts_to_ns([r.ts for r in _TS_ONLY_LIST_DECODER.decode(text)])


def exact_ts_of_trace(data: bytes) -> np.ndarray:
    """Timestamps of all events of a whole trace, from their JSON text."""
    return us_texts_to_ns([r.ts for r in _TS_ONLY_DECODER.decode(data).traceEvents])


_SHAPES_LIST_DECODER = msgspec.json.Decoder(list[_ShapesOnly])
_SHAPES_DECODER = msgspec.json.Decoder(_ShapesOnlyTrace)


def shapes_of_array(text: bytes) -> list[Any]:
    """The `args` (shape fields only, as plain JSON values) of the events of a JSON array."""
    return [e.args for e in _SHAPES_LIST_DECODER.decode(text)]


def shapes_of_trace(data: bytes) -> list[Any]:
    """The same for all events of a whole trace."""
    return [e.args for e in _SHAPES_DECODER.decode(data).traceEvents]


@contextmanager
def gc_paused() -> Iterator[None]:
    """Millions of small objects are created and freed at once: the cyclic GC would only rescan them."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


# --- the whole file at once: the reference path, and every error message ---------------------------------
BOM = b"\xef\xbb\xbf"  # a UTF-8 byte order mark: some editors and Windows tools begin files with it


def read_json_bytes(path: Path, most: int | None = None, why: str = "") -> bytes:
    """The file's JSON text, inflated if gzipped. `most`: refuse a text longer than that, saying `why` the
    file is read whole."""
    from stepscope.analysis.read.limits import (
        DEFAULT_MAX_TRACE_BYTES,
        LIMIT_ENV,
        MAX_EVENT_BYTES_ENV,
        gunzip_bounded,
        max_gzip_ratio,
        max_input_bytes,
    )

    limit = max_input_bytes(DEFAULT_MAX_TRACE_BYTES)
    cap = limit if most is None else min(most, limit)
    too_long = InputError(
        path,
        f"{why or 'it cannot be read in pieces'}, and decoding it whole would take more than {cap} bytes of text "
        f"({MAX_EVENT_BYTES_ENV} raises the limit)",
    )
    try:
        size = path.stat().st_size
        if size > limit:
            raise InputError(path, f"larger than the input limit of {limit} bytes ({LIMIT_ENV} raises it)")
        if size > cap:
            raise too_long
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
    if data[:2] != b"\x1f\x8b":
        return data
    if cap < limit:
        try:
            return gunzip_bounded(path, data, cap, ratio=max_gzip_ratio())
        except InputError as exc:
            if "bytes (the limit;" in exc.problem:
                raise too_long from None
            raise
    return gunzip_bounded(path, data, limit, ratio=max_gzip_ratio())


_EVENT_AT = re.compile(r"`\$(?:\.traceEvents)?\[(\d+)\]")


def wrong_type_problem(exc: msgspec.ValidationError, first_event: int) -> str:
    """msgspec's message for a field of the wrong type in events decoded from a piece of the file, its
    location given in the whole file (`first_event`: events before the piece)."""
    message = _EVENT_AT.sub(lambda m: f"`$.traceEvents[{int(m.group(1)) + first_event}]", str(exc), count=1)
    return f"wrong field type: {message}"


def decode_whole(path: Path, data: bytes) -> _Trace:
    """Decode a whole file with the permissive Structs; `ts` is kept as JSON text when the start of the
    file shows float timestamps that float64 would round (otherwise the builder may need a ts-only pass)."""
    if not data or data.isspace():
        raise InputError(path, "empty file")
    shift = len(BOM) if data.startswith(BOM) else 0
    decoder = _TEXT_TS_DECODER if EPOCH_FLOAT_TS.search(data, 0, SNIFF_BYTES) else _DECODER
    try:
        trace: _Trace = decoder.decode(memoryview(data)[shift:])
    except msgspec.ValidationError as exc:
        message = str(exc)
        if "missing required field `traceEvents`" in message:
            raise InputError(path, "JSON without traceEvents: not a chrome trace") from None
        if " - at `$" not in message:  # msgspec names no location for the top level
            raise InputError(path, "not a chrome trace: the top level is not a JSON object") from None
        raise InputError(path, f"wrong field type: {message}") from None
    except msgspec.DecodeError as exc:  # (its byte offsets counted from the file's start, mark included)
        message = re.sub(r"\(byte (\d+)\)", lambda m: f"(byte {int(m.group(1)) + shift})", str(exc))
        raise InputError(path, json_problem(message)) from None
    except UnicodeDecodeError as exc:  # a string that is not UTF-8
        raise InputError(path, json_problem(f"bad UTF-8 at byte {exc.start} of a string")) from None
    return trace


def load_whole(
    path: Path, rank_hint: int | None, *, flows: bool = True, most: int | None = None, why: str = ""
) -> FileTable:
    """A file's table from one decode of all its text (about 3 times the text in memory; same table as the
    chunked reader). `most`: refuse a text longer than that (saying `why` it is read whole)."""
    data = read_json_bytes(path, most, why)
    trace = decode_whole(path, data)
    data = data.removeprefix(BOM)  # (for the second passes over the text)
    builder = ColumnBuilder(path, flows=flows)
    read_header(builder.info, {key: getattr(trace, key) for key in HEADER_FIELDS})
    decoders = DECODERS[(False, isinstance(trace, _TextTsTrace))]
    add_events(
        builder,
        decoders.chunk(trace.traceEvents, lambda: exact_ts_of_trace(data), lambda: shapes_of_trace(data)),
    )
    return builder.finish(rank_hint)


def add_events(builder: ColumnBuilder, chunk: Chunk) -> None:
    """builder.add, with a `ts` that is not a number reported as the event it belongs to."""
    try:
        builder.add(chunk)
    except NotANumber as exc:
        raise InputError(
            builder.path,
            f"wrong field type: `ts` of event {exc.index} is {exc.text[:30]!r}",
        ) from None


def read_header(info: RankInfo, header: dict[str, Any]) -> None:
    dist = header["distributedInfo"] if isinstance(header["distributedInfo"], dict) else {}
    rank = dist.get("rank")
    if type(rank) is int and 0 <= rank < 2**31:
        info.rank = rank
    world = dist.get("world_size")
    info.world_size = world if type(world) is int else None
    backend = dist.get("backend")
    info.backend = backend if isinstance(backend, str) else None
    info.merge_header = header.get("stepscopeMerge")
    groups = dist.get("pg_config")
    info.process_groups = [g for g in groups if isinstance(g, dict)] if isinstance(groups, list) else []
    props = header["deviceProperties"]
    info.device_properties = [d for d in props if isinstance(d, dict)] if isinstance(props, list) else []
