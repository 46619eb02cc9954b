"""Collectives in a chrome trace: per kind (all_reduce, all_gather, ...) the count, bytes and time.

Torch-free and shared: capture writes this summary at window ends; analysis may read traces with it too.

CommDebugMode only counts; the trace also has sizes and durations. Each collective leaves several events:

- a backend range `nccl:all_reduce` / `gloo:all_reduce` (cat user_annotation): one per collective;
- `record_param_comms` (cpu_op) with args `Collective name`, `In msg nelems`, `dtype`, `Group size`;
- the c10d dispatch op `c10d::allreduce_` (cpu_op);
- on GPUs, the NCCL kernel (cat kernel, `ncclDevKernel_AllReduce...`), newer torch adds the same args to it.

Counts come from the first of record_param_comms / backend range / c10d op / kernel that the trace has for a
kind, so no collective is counted twice. Bytes are the input message of each collective on this rank (from
record_param_comms or kernel args, else from the backend range's `Input Dims` when shapes were recorded).
Time is the summed duration of the NCCL kernels (device time) when there are any, else of the backend ranges:
for gloo that is the collective itself on gloo's thread; for NCCL without kernels only the CPU enqueue.

No torch here; the file is read with msgspec, decoding the args of candidate events only.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

SCHEMA = "stepscope.trace_collectives/1"

# Bytes per element: torch ScalarType names (record_param_comms `dtype`) and C++ type names (`Input type`).
DTYPE_BYTES: dict[str, int] = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2, "c10::half": 2,
    "bfloat16": 2, "c10::bfloat16": 2, "long": 8, "long int": 8, "int64": 8, "int": 4, "int32": 4,
    "short": 2, "short int": 2, "int16": 2, "char": 1, "signed char": 1, "int8": 1, "byte": 1,
    "unsigned char": 1, "uint8": 1, "bool": 1, "complexfloat": 8, "complexdouble": 16,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    "c10::float8_e4m3fn": 1, "c10::float8_e5m2": 1,
}  # fmt: skip

# Canonical kinds, keyed by the name with underscores removed.
_KINDS = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "reducescatter": "reduce_scatter",
    "alltoall": "all_to_all",
    "alltoallv": "all_to_all",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
    "send": "send",
    "recv": "recv",
    "sendrecv": "send_recv",
    "barrier": "barrier",
}
_NOT_COLLECTIVES = {"wait", "init", "split", "monitoredbarrier", ""}
_BACKEND_RANGE = re.compile(r"^(nccl|gloo|ucc|mpi|xccl|hccl|rccl):(.+)$")
_NCCL_KERNEL = re.compile(r"^(?:nccl|rccl)(?:Dev)?Kernel_([A-Za-z]+)", re.IGNORECASE)
SOURCES = ("record_param_comms", "backend_range", "c10d_op", "kernel")


def collective_kind(raw: str) -> str | None:
    """Canonical kind of a collective name from any source (`allreduce`, `_allgather_base_`, `AllReduce`)."""
    name = raw.strip().lower().strip("_")
    for suffix in ("_coalesced", "_into_tensor", "_tensor", "_base", "_single"):
        name = name.replace(suffix, "")
    key = name.replace("_", "")
    if key in _NOT_COLLECTIVES:
        return None
    return _KINDS.get(key, name or None)


@dataclass
class CollectiveStats:
    """One kind of collective on one rank."""

    kind: str
    count: int = 0
    count_source: str = ""
    bytes: int | None = None  # input message bytes summed over the collectives (None: not in the trace)
    time_us: float | None = None
    time_source: str | None = None  # "device" (NCCL kernels), "cpu" (backend range), "cpu enqueue"
    dtypes: list[str] = field(default_factory=list)
    group_sizes: list[int] = field(default_factory=list)


@dataclass
class CollectivesSummary:
    """The collectives of one trace file."""

    schema: str = SCHEMA
    rank: int | None = None
    backend: str | None = None
    world_size: int | None = None
    collectives: list[CollectiveStats] = field(default_factory=list)


@dataclass
class _Tally:
    count: int = 0
    dur_us: float = 0.0
    bytes: int = 0
    sized: int = 0  # events whose size was known
    dtypes: set[str] = field(default_factory=set)
    groups: set[int] = field(default_factory=set)
    backends: set[str] = field(default_factory=set)  # prefixes of backend ranges: gloo, nccl, ...


# Backends whose range on the CPU spans the collective itself (not just its enqueue on a GPU stream).
_CPU_BACKENDS = {"gloo", "mpi", "ucc"}


def _classify(event: Mapping[str, Any]) -> tuple[str, str] | None:
    """(source, kind) of a collective event, None for anything else."""
    name = str(event.get("name", ""))
    cat = str(event.get("cat", "")).lower()
    args = event.get("args") or {}
    if name == "record_param_comms":
        kind = collective_kind(str(args.get("Collective name", "")))
        return ("record_param_comms", kind) if kind else None
    if cat in ("kernel",):
        match = _NCCL_KERNEL.match(name)
        if match is None:
            return None
        kind = collective_kind(str(args.get("Collective name", "")) or match.group(1))
        return ("kernel", kind) if kind else None
    if cat == "user_annotation":
        match = _BACKEND_RANGE.match(name)
        kind = collective_kind(match.group(2)) if match else None
        return ("backend_range", kind) if kind else None
    if cat in ("cpu_op", "operator") and name.startswith("c10d::"):
        kind = collective_kind(name[len("c10d::") :])
        return ("c10d_op", kind) if kind else None
    return None


def _message_bytes(args: Mapping[str, Any]) -> tuple[int | None, str | None]:
    """Input message bytes and dtype from an event's args, when it has them."""
    dtype = args.get("dtype")
    nelems = args.get("In msg nelems")
    if isinstance(nelems, int) and isinstance(dtype, str):
        size = DTYPE_BYTES.get(dtype.lower())
        return (nelems * size if size else None), dtype
    dims, types = args.get("Input Dims"), args.get("Input type")
    if isinstance(dims, list) and isinstance(types, list) and dims and types:
        shape, type_name = dims[0], str(types[0])
        size = DTYPE_BYTES.get(type_name.lower())
        if size and isinstance(shape, list) and shape and all(isinstance(d, int) for d in shape):
            count = 1
            for d in shape:
                count *= d
            return count * size, type_name
    return None, (dtype if isinstance(dtype, str) else None)


def summarize_collectives(events: Iterable[Mapping[str, Any]]) -> list[CollectiveStats]:
    """Per kind count, bytes and time from chrome-trace events (plain dicts), sorted by time then count."""
    tallies: dict[tuple[str, str], _Tally] = {}
    for event in events:
        found = _classify(event)
        if found is None:
            continue
        tally = tallies.setdefault(found, _Tally())
        tally.count += 1
        dur = event.get("dur")
        if isinstance(dur, (int, float)):
            tally.dur_us += float(dur)
        args = event.get("args") or {}
        size, dtype = _message_bytes(args)
        if size is not None:
            tally.bytes += size
            tally.sized += 1
        if dtype:
            tally.dtypes.add(dtype)
        group = args.get("Group size")
        if isinstance(group, int):
            tally.groups.add(group)
        if found[0] == "backend_range":
            tally.backends.add(str(event.get("name", "")).split(":", 1)[0])
    kinds = sorted({kind for _, kind in tallies})
    return sorted(
        (_combine(kind, tallies) for kind in kinds), key=lambda s: (-(s.time_us or 0.0), -s.count, s.kind)
    )


def _combine(kind: str, tallies: Mapping[tuple[str, str], _Tally]) -> CollectiveStats:
    by_source = {source: tallies[(source, kind)] for source in SOURCES if (source, kind) in tallies}
    count_source = next(iter(by_source))
    stats = CollectiveStats(kind=kind, count=by_source[count_source].count, count_source=count_source)
    for source in ("record_param_comms", "kernel", "backend_range"):
        tally = by_source.get(source)
        if tally is not None and tally.sized and tally.sized == tally.count:
            stats.bytes = tally.bytes
            break
    if "kernel" in by_source:
        stats.time_us, stats.time_source = by_source["kernel"].dur_us, "device"
    elif "backend_range" in by_source:
        ranges = by_source["backend_range"]
        stats.time_us = ranges.dur_us
        stats.time_source = "cpu" if ranges.backends <= _CPU_BACKENDS else "cpu enqueue"
    dtypes: set[str] = set()
    groups: set[int] = set()
    for tally in by_source.values():
        dtypes |= tally.dtypes
        groups |= tally.groups
    stats.dtypes, stats.group_sizes = sorted(dtypes), sorted(groups)
    return stats


class _Event(msgspec.Struct):
    name: str = ""
    cat: str = ""
    ph: str = ""
    dur: float | None = None
    args: msgspec.Raw = msgspec.Raw(b"")


class _Trace(msgspec.Struct):
    traceEvents: list[_Event] = []
    distributedInfo: dict[str, Any] | None = None


_decoder = msgspec.json.Decoder(_Trace)
_args_decoder = msgspec.json.Decoder(dict[str, Any])


def _is_candidate(event: _Event) -> bool:
    name = event.name
    return (
        name == "record_param_comms"
        or name.startswith("c10d::")
        or (":" in name and _BACKEND_RANGE.match(name) is not None)
        or (event.cat.lower() == "kernel" and _NCCL_KERNEL.match(name) is not None)
    )


def collectives_from_trace(path: str | Path) -> CollectivesSummary:
    """Summarize the collectives of one chrome trace file (`.json` or `.json.gz`)."""
    path = Path(path)
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    trace = _decoder.decode(data)
    events = []
    for event in trace.traceEvents:
        if event.ph == "X" and _is_candidate(event):
            args = _args_decoder.decode(event.args) if len(event.args) else {}
            events.append({"name": event.name, "cat": event.cat, "dur": event.dur, "args": args})
    info = trace.distributedInfo or {}
    backend = info.get("backend") if isinstance(info.get("backend"), str) else None
    stats = summarize_collectives(events)
    rank = info.get("rank")
    world = info.get("world_size")
    return CollectivesSummary(
        rank=rank if isinstance(rank, int) else None,
        backend=backend,
        world_size=world if isinstance(world, int) else None,
        collectives=stats,
    )
