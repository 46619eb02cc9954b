"""Collectives of one rank's window: per kind (all_reduce, all_gather, ...) the count, message bytes and time.

Computed over the TraceTable (the one trace reader). Each collective leaves several events in a trace:

- a backend range `nccl:all_reduce` / `gloo:all_reduce` (cat user_annotation): one per collective;
- `record_param_comms` (cpu_op) with args `Collective name`, `In msg nelems`, `dtype`, `Group size`;
- the c10d dispatch op `c10d::allreduce_` (cpu_op);
- on GPUs, the NCCL kernel (cat kernel, `ncclDevKernel_AllReduce...`); newer torch adds the same args to it.

Counts come from the first of record_param_comms / backend range / c10d op / kernel that the trace has for a
kind, so no collective is counted twice. Bytes are the input message of each collective on this rank, from
the args of record_param_comms or of the kernels (absent otherwise: gloo without record_param_comms gives none).
Time is the summed duration of the NCCL kernels (device time) when there are any, else of the backend ranges:
for gloo that is the collective itself on gloo's thread; for NCCL without kernels only the CPU enqueue.
Events count when they start inside the window [lo, hi).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import msgspec
import numpy as np

from stepscope.analysis.table import MISSING, TraceTable

# Bytes per element: torch ScalarType names (record_param_comms `dtype`) and C++ type names.
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
BACKEND_RANGE = re.compile(r"^(nccl|gloo|ucc|mpi|xccl|hccl|rccl):(.+)$")
NCCL_KERNEL = re.compile(r"^(?:nccl|rccl)(?:Dev)?Kernel_([A-Za-z]+)", re.IGNORECASE)
SOURCES = ("record_param_comms", "backend_range", "c10d_op", "kernel")
_CPU_BACKENDS = {"gloo", "mpi", "ucc"}  # their range on the CPU spans the collective itself
_SOURCE_CATEGORIES = {
    "record_param_comms": ("cpu_op",),
    "c10d_op": ("cpu_op",),
    "backend_range": ("user_annotation",),
    "kernel": ("kernel",),
}


class CollectiveStats(msgspec.Struct):
    """One kind of collective on one rank, over the analysed window."""

    rank: int
    kind: str
    count: int
    count_source: str  # record_param_comms | backend_range | c10d_op | kernel
    bytes: int | None  # input message bytes summed over the collectives; null when the trace lacks sizes
    time_ms: float | None
    time_source: str | None  # "device" (NCCL kernels), "cpu" (gloo/mpi/ucc range), "cpu enqueue"
    dtypes: list[str]
    group_sizes: list[int]


@dataclass
class _Tally:
    count: int = 0
    dur_ns: int = 0
    bytes: int = 0
    sized: int = 0  # events whose size was known
    dtypes: set[str] = field(default_factory=set)
    groups: set[int] = field(default_factory=set)
    backends: set[str] = field(default_factory=set)  # prefixes of backend ranges: gloo, nccl, ...


def collective_kind(raw: str) -> str | None:
    """Canonical kind of a collective name from any source (`allreduce`, `_allgather_base_`, `AllReduce`)."""
    name = raw.strip().lower().strip("_")
    for suffix in ("_coalesced", "_into_tensor", "_tensor", "_base", "_single"):
        name = name.replace(suffix, "")
    key = name.replace("_", "")
    if key in _NOT_COLLECTIVES:
        return None
    return _KINDS.get(key, name or None)


def _event_class(name: str) -> tuple[str, str] | None:
    """(source, kind) from an event name alone; record_param_comms is decided by its args."""
    if name == "record_param_comms":
        return ("record_param_comms", "")
    if name.startswith("c10d::"):
        kind = collective_kind(name[len("c10d::") :])
        return ("c10d_op", kind) if kind else None
    match = BACKEND_RANGE.match(name)
    if match is not None:
        kind = collective_kind(match.group(2))
        return ("backend_range", kind) if kind else None
    match = NCCL_KERNEL.match(name)
    if match is not None:
        kind = collective_kind(match.group(1))
        return ("kernel", kind) if kind else None
    return None


def rank_collectives(table: TraceTable, rank: int, lo: int, hi: int) -> list[CollectiveStats]:
    """Per kind count, bytes and time of the collectives of `rank` (the table holds its rows) in [lo, hi)."""
    cols = table.columns
    names = cols["name"]
    classes = table.name_values(_event_class, object, key="collective_class", among=names)
    named = table.name_values(
        lambda n: _event_class(n) is not None, bool, key="collective_named", among=names
    )
    candidate = np.flatnonzero(
        (cols["ph"] == ord("X")) & (cols["ts"] >= lo) & (cols["ts"] < hi) & named[names]
    )
    if not len(candidate):
        return []
    cat_names = table.cats
    tallies: dict[tuple[str, str], _Tally] = {}
    for row in candidate.tolist():
        source, kind = classes[names[row]]
        cat_code = int(cols["cat"][row])
        cat = cat_names[cat_code] if cat_code != MISSING else ""
        if cat not in _SOURCE_CATEGORIES[source]:
            continue
        collective = _arg_text(table, "args_collective", row)
        if source == "record_param_comms" or (source == "kernel" and collective):
            kind = collective_kind(collective) or ("" if source == "record_param_comms" else kind)
        if not kind:
            continue
        tally = tallies.setdefault((source, kind), _Tally())
        tally.count += 1
        tally.dur_ns += int(cols["dur"][row])
        dtype = _arg_text(table, "args_dtype", row)
        nelems = int(cols["args_in_nelems"][row])
        if dtype:
            tally.dtypes.add(dtype)
            size = DTYPE_BYTES.get(dtype.lower())
            if size and nelems >= 0:
                tally.bytes += nelems * size
                tally.sized += 1
        group = int(cols["args_group_size"][row])
        if group > 0:
            tally.groups.add(group)
        if source == "backend_range":
            tally.backends.add(table.names[names[row]].split(":", 1)[0])
    kinds = sorted({kind for _, kind in tallies})
    stats = [_combine(rank, kind, tallies) for kind in kinds]
    return sorted(stats, key=lambda s: (-(s.time_ms or 0.0), -s.count, s.kind))


def _arg_text(table: TraceTable, column: str, row: int) -> str:
    code = int(table.columns[column][row])
    return table.names[code] if code != MISSING else ""


def _combine(rank: int, kind: str, tallies: dict[tuple[str, str], _Tally]) -> CollectiveStats:
    by_source = {source: tallies[(source, kind)] for source in SOURCES if (source, kind) in tallies}
    count_source = next(iter(by_source))
    size: int | None = None
    for source in ("record_param_comms", "kernel"):
        tally = by_source.get(source)
        if tally is not None and tally.sized and tally.sized == tally.count:
            size = tally.bytes
            break
    time_ms: float | None = None
    time_source: str | None = None
    if "kernel" in by_source:
        time_ms, time_source = by_source["kernel"].dur_ns / 1e6, "device"
    elif "backend_range" in by_source:
        ranges = by_source["backend_range"]
        time_ms = ranges.dur_ns / 1e6
        time_source = "cpu" if ranges.backends <= _CPU_BACKENDS else "cpu enqueue"
    dtypes: set[str] = set()
    groups: set[int] = set()
    for tally in by_source.values():
        dtypes |= tally.dtypes
        groups |= tally.groups
    return CollectiveStats(
        rank=rank,
        kind=kind,
        count=by_source[count_source].count,
        count_source=count_source,
        bytes=size,
        time_ms=time_ms,
        time_source=time_source,
        dtypes=sorted(dtypes),
        group_sizes=sorted(groups),
    )
