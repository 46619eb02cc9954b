"""Synthetic Kineto-style traces for tests, and the one place that turns a trace file into a TraceTable.

Times given to the builders are microseconds, as Kineto writes them.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from stepscope.analysis.table import TraceTable

SHARED_TRACES = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces"

Event = dict[str, Any]


def step(n: int, ts: float, dur: float, tid: int = 1) -> Event:
    return cpu(f"ProfilerStep#{n}", ts, dur, cat="user_annotation", tid=tid)


def cpu(name: str, ts: float, dur: float, *, cat: str = "cpu_op", tid: int = 1, **args: Any) -> Event:
    return {"ph": "X", "cat": cat, "name": name, "pid": 100, "tid": tid, "ts": ts, "dur": dur, "args": args}


def runtime(name: str, ts: float, dur: float, corr: int, *, tid: int = 1) -> Event:
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


def table_of(events_by_rank: Mapping[int, Iterable[Event]]) -> TraceTable:
    return TraceTable.from_events(events_by_rank)


def write_trace(path: Path, events: Iterable[Event], *, rank: int | None = None, world_size: int = 1) -> Path:
    doc: dict[str, Any] = {"schemaVersion": 1, "traceEvents": list(events)}
    if rank is not None:
        doc["distributedInfo"] = {"rank": rank, "world_size": world_size, "backend": "nccl"}
    data = json.dumps(doc).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


def load(path: Path) -> TraceTable:
    """A trace file or folder as a TraceTable, through the real loader."""
    from stepscope.analysis.loader import load_trace

    return load_trace(path)
