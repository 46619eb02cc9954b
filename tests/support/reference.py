"""The reference table builder: slow and simple, the oracle the fast loader is tested against.

`reference_table` builds a `TraceTable` from plain chrome-trace event dicts, one iterable per rank; the fast
loader (stepscope.analysis.read.loader) must give the same table for the same events. `reference` reads a trace
file for it, with exact decimals.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np

from stepscope.analysis.read.messages import (
    ALL_TO_ALL_INPUTS,
    P2P_OPS,
    SHAPED_RANGE_RE,
    all_to_all_message,
    p2p_peer,
    shapes_message,
)
from stepscope.analysis.read.table import (
    COLUMNS,
    GPU_CATEGORIES,
    INT_ARGS,
    MISSING,
    OLD_CATEGORIES,
    OUT_OF_RANGE_NS,
    STRING_ARGS,
    SYNC_CATEGORY,
    SYNC_INT_ARGS,
    RankInfo,
    TraceTable,
    _clipped,
    as_int,
    decimal_us_to_ns,
    id_as_int,
)


def reference(path: Path, rank: int = 0) -> TraceTable:
    """The reference table of one file, read with exact decimals."""
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    doc = json.loads(data, parse_float=Decimal)  # exact ts / dur; every other float as the loader reads it
    for event in doc["traceEvents"]:
        if isinstance(event, dict) and isinstance(event.get("args"), dict):
            event["args"] = json.loads(json.dumps(event["args"], default=float), parse_float=float)
    return reference_table({rank: doc["traceEvents"]}, {rank: str(path)})


def reference_table(
    events_by_rank: Mapping[int, Iterable[Mapping[str, Any]]],
    sources: Mapping[int, str] | None = None,
) -> TraceTable:
    """Build a table from plain chrome-trace event dicts, one iterable per rank.

    Timestamps are exact when the dicts hold ints or `Decimal`s (`json.load(f, parse_float=Decimal)`);
    Python floats are rounded to the nearest ns of their binary value (at epoch-microsecond magnitudes
    that is ~0.25 us off, which is why the fast loader parses the decimal text instead).
    """
    names: dict[str, int] = {}
    cats: dict[str, int] = {}
    rows: dict[str, list[int]] = {c: [] for c in COLUMNS}
    for key in STRING_ARGS:
        rows["args_" + key] = []
    for key in INT_ARGS:
        rows["args_" + key] = []
    rows["args_peer"] = []
    for key in SYNC_INT_ARGS:
        rows["args_" + key] = []
    ranks: dict[int, RankInfo] = {}

    def intern(table: dict[str, int], value: str) -> int:
        return table.setdefault(value, len(table))

    for rank, events in events_by_rank.items():
        ranks[rank] = RankInfo(rank=rank, source=(sources or {}).get(rank, f"<rank {rank}>"))
        for ev in events:
            ph = ev.get("ph", "")
            if not isinstance(ph, str) or len(ph) != 1 or not ph.isascii() or ph == "M":
                continue
            args = ev.get("args") or {}
            cat = ev.get("cat")
            cat = OLD_CATEGORIES.get(cat, cat) if isinstance(cat, str) else None
            rows["rank"].append(rank)
            rows["ph"].append(ord(ph))
            rows["cat"].append(intern(cats, cat) if cat is not None else MISSING)
            name = ev.get("name")
            rows["name"].append(intern(names, "" if name is None else str(name)))
            rows["pid"].append(id_as_int(ev.get("pid")))
            rows["tid"].append(id_as_int(ev.get("tid")))
            rows["ts"].append(_us_to_ns(ev.get("ts")))
            dur = _us_to_ns(ev.get("dur"))
            rows["dur"].append(max(dur, 0))
            is_gpu = cat in GPU_CATEGORIES
            stream = as_int(args.get("stream")) if is_gpu else MISSING
            rows["stream"].append(stream if -(2**31) <= stream < 2**31 else MISSING)  # int32 column
            device = as_int(args.get("device")) if is_gpu else MISSING
            rows["device"].append(device if -(2**31) <= device < 2**31 else MISSING)
            rows["correlation"].append(as_int(args.get("correlation")))
            rows["bytes"].append(as_int(args.get("bytes")) if is_gpu else MISSING)
            for key, arg in STRING_ARGS.items():
                value = args.get(arg)
                rows["args_" + key].append(intern(names, str(value)) if value is not None else MISSING)
            for key, arg in INT_ARGS.items():
                rows["args_" + key].append(as_int(args.get(arg)))
            peer = p2p_peer(args.get("Concrete Inputs")) if name in P2P_OPS else None
            rows["args_peer"].append(MISSING if peer is None else peer)
            for key, arg in SYNC_INT_ARGS.items():
                rows["args_" + key].append(as_int(args.get(arg)) if cat == SYNC_CATEGORY else MISSING)
            rare = (*STRING_ARGS.values(), *INT_ARGS.values())
            if str(name) in ALL_TO_ALL_INPUTS and all(args.get(arg) is None for arg in rare):
                found = all_to_all_message(
                    str(name), args.get("Input Dims"), args.get("Input type"), args.get("Concrete Inputs")
                )
                if found is not None:
                    rows["args_in_nelems"][-1], rows["args_out_nelems"][-1] = found[0], found[1]
                    if found[2] is not None:
                        rows["args_dtype"][-1] = intern(names, found[2])
                    rows["args_in_split"][-1] = intern(names, found[3])
                    rows["args_out_split"][-1] = intern(names, found[4])
            elif SHAPED_RANGE_RE.match(str(name)) and all(args.get(arg) is None for arg in rare):
                message = shapes_message(args.get("Input Dims"), args.get("Input type"))
                if message is not None:
                    rows["args_in_nelems"][-1] = message[0]
                    if message[1] is not None:
                        rows["args_dtype"][-1] = intern(names, message[1])
    dtypes = {c: d for c, (d, _) in COLUMNS.items()}
    columns = {c: np.asarray(v, dtype=dtypes.get(c, "int64")) for c, v in rows.items()}
    return TraceTable(list(names), list(cats), columns, ranks)


def _us_to_ns(value: Any) -> int:
    """Kineto microseconds (int, float or Decimal with a ns fraction) -> integer ns; 0 when absent or invalid.

    Exact for ints and Decimals (a fraction beyond ns is rounded half to even). A finite value whose ns do
    not fit int64 gives +-int64 max (OUT_OF_RANGE_NS), which the loader refuses rather than read as 0.
    """
    if isinstance(value, bool) or value is None:
        return 0
    if isinstance(value, int):
        ns = value * 1000
        return ns if -OUT_OF_RANGE_NS <= ns <= OUT_OF_RANGE_NS else _clipped(ns)
    if isinstance(value, float) and value == value:
        return round(value * 1000) if abs(value) < 9e15 else _clipped(value)
    if isinstance(value, Decimal):
        return decimal_us_to_ns(value)
    return 0
