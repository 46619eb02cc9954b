"""Synthetic Kineto-style traces for tests, and the one place that turns a trace file into a TraceTable.

Times given to the builders are microseconds, as Kineto writes them.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys
import types
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from stepscope.analysis.table import TraceTable
from stepscope.errors import InputError

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
    """A trace file or folder as a TraceTable: the fast loader when present, else the slow json reference path."""
    try:
        from stepscope.analysis.loader import load_trace
    except ImportError:
        return json_load(path)
    return load_trace(path)


def json_load(path: Path | str) -> TraceTable:
    """Reference loader (json + TraceTable.from_events) standing in for stepscope.analysis.loader until it lands."""
    path = Path(path)
    if not path.exists():
        raise InputError(path, "no such file or directory")
    files = sorted(p for p in path.glob("*.json*") if p.is_file()) if path.is_dir() else [path]
    if not files:
        raise InputError(path, "no trace files (.json / .json.gz) in this folder")
    by_rank: dict[int, list[Event]] = {}
    sources: dict[int, str] = {}
    for i, f in enumerate(files):
        raw = f.read_bytes()
        try:
            doc = json.loads(gzip.decompress(raw) if f.name.endswith(".gz") else raw)
        except (OSError, ValueError, EOFError) as exc:
            raise InputError(f, f"not a readable trace ({type(exc).__name__})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
            raise InputError(f, "no traceEvents list")
        rank = (doc.get("distributedInfo") or {}).get("rank", i)
        rank = rank if isinstance(rank, int) and rank not in by_rank else max(by_rank, default=-1) + 1
        by_rank[rank] = doc["traceEvents"]
        sources[rank] = str(f)
    return TraceTable.from_events(by_rank, sources)


def ensure_loader() -> None:
    """Make `stepscope.analysis.loader.load_trace` importable: the real module, else `json_load` under its name."""
    if "stepscope.analysis.loader" in sys.modules or importlib.util.find_spec("stepscope.analysis.loader"):
        return
    module = types.ModuleType("stepscope.analysis.loader")
    module.load_trace = json_load  # type: ignore[attr-defined]
    sys.modules["stepscope.analysis.loader"] = module
