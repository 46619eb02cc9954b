"""Small synthetic Kineto traces with known numbers, written as the profiler writes them."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

SHARED_TRACES = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces"

PID, TID = 100, 101  # host process / main thread of synthetic traces


def op(
    name: str, ts: float, dur: float, *, cat: str = "cpu_op", tid: int = TID, **args: Any
) -> dict[str, Any]:
    """A complete ('X') host-side event."""
    return {"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": tid, "ts": ts, "dur": dur, "args": args}


def kernel(
    name: str, ts: float, dur: float, *, stream: int = 7, device: int = 0, cat: str = "kernel", **args: Any
) -> dict[str, Any]:
    """A GPU activity on `stream` (pid = device, tid = stream, as Kineto writes them)."""
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": device,
        "tid": stream,
        "ts": ts,
        "dur": dur,
        "args": {"device": device, "stream": stream, **args},
    }


def step(n: int, ts: float, dur: float) -> dict[str, Any]:
    return op(f"ProfilerStep#{n}", ts, dur, cat="user_annotation")


def trace(events: list[dict[str, Any]], rank: int | None = 0, **top: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"schemaVersion": 1, **top, "traceEvents": events}
    if rank is not None:
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": 2}
    return doc


def write(path: Path, doc: Any) -> Path:
    """Write JSON, gzipped when the name ends in .gz; `doc` may also be raw text or bytes."""
    data = doc if isinstance(doc, bytes) else (doc if isinstance(doc, str) else json.dumps(doc)).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


# Every args key the loader reads (and "name" of metadata events), plus ones it must ignore: for the property
# tests that throw random args at the loader.
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
