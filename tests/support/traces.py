"""The one builder of synthetic Kineto-style traces for tests, and the one place that turns a trace file into a
TraceTable.

Times given to the builders are microseconds, as Kineto writes them. Host events run in process PID on thread
TID unless told otherwise; GPU activities are on `pid` = device 0, `tid` = their stream, as Kineto writes them.

benchmarks/compare_hta.py and compare_critical_path.py import this module as `tests.support.traces` (the
repository's root on sys.path).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from stepscope.analysis.read.table import TraceTable

SHARED_TRACES = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces"

PID, TID = 100, 1  # host process / main thread of synthetic traces

Event = dict[str, Any]


# --- events --------------------------------------------------------------------------------------------
def cpu(name: str, ts: float, dur: float, *, cat: str = "cpu_op", tid: int = TID, **args: Any) -> Event:
    """A complete ('X') host-side event; keyword arguments beyond these are its args."""
    return {"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": tid, "ts": ts, "dur": dur, "args": args}


def step(n: int, ts: float, dur: float, tid: int = TID) -> Event:
    """The `ProfilerStep#n` annotation."""
    return cpu(f"ProfilerStep#{n}", ts, dur, cat="user_annotation", tid=tid)


def runtime(name: str, ts: float, dur: float, corr: int, *, tid: int = TID) -> Event:
    """A CUDA runtime call with correlation id `corr`."""
    return cpu(name, ts, dur, cat="cuda_runtime", tid=tid, correlation=corr)


def kernel(
    name: str,
    ts: float,
    dur: float,
    *,
    stream: int = 7,
    corr: int | None = None,
    cat: str = "kernel",
    **args: Any,
) -> Event:
    """A GPU activity of device 0 on `stream`; `corr`: the correlation id of the runtime call that launched it."""
    a: dict[str, Any] = {"device": 0, "stream": stream, **args}
    if corr is not None:
        a["correlation"] = corr
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur, "args": a}


def launched(
    name: str, launch_ts: float, ts: float, dur: float, corr: int, *, stream: int = 7, **kw: Any
) -> list[Event]:
    """A cudaLaunchKernel call at `launch_ts` (1 us long) and the kernel it launched."""
    return [
        runtime("cudaLaunchKernel", launch_ts, 1, corr),
        kernel(name, ts, dur, stream=stream, corr=corr, **kw),
    ]


# --- documents and files -------------------------------------------------------------------------------
def trace(events: Iterable[Event], rank: int | None = 0, *, world_size: int = 2) -> dict[str, Any]:
    """A trace document; `rank` None: without distributedInfo."""
    doc: dict[str, Any] = {"schemaVersion": 1, "traceEvents": list(events)}
    if rank is not None:
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world_size}
    return doc


def write(path: Path, doc: Any) -> Path:
    """Write JSON, gzipped when the name ends in .gz; `doc` may also be raw text or bytes."""
    data = doc if isinstance(doc, bytes) else (doc if isinstance(doc, str) else json.dumps(doc)).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


def write_trace(path: Path, events: Iterable[Event], rank: int | None = 0, *, world_size: int = 2) -> Path:
    """`write(path, trace(events, rank, world_size=world_size))`."""
    return write(path, trace(events, rank, world_size=world_size))


# --- tables --------------------------------------------------------------------------------------------
def table_of(events_by_rank: Mapping[int, Iterable[Event]]) -> TraceTable:
    """The table of these events, one list per rank, built by the reference builder (no file)."""
    from .reference import reference_table

    return reference_table(events_by_rank)


def load(path: Path) -> TraceTable:
    """A trace file or folder as a TraceTable, through the real loader."""
    from stepscope.analysis.read.loader import load_trace

    return load_trace(path)


# Args keys the loader reads, plus ones it must ignore: for the property tests that throw random args at it.
ARG_KEYS = [
    "stream",
    "device",
    "correlation",
    "External id",
    "external id",
    "bytes",
    "Collective name",
    "dtype",
    "Process Group Name",
    "In msg nelems",
    "Out msg nelems",
    "Group size",
    "name",
    "other",
    "shapes",
]
