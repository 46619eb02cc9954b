"""Analyze the JSON that `torch.profiler.profile.export_memory_timeline` writes (no torch needed).

Two shapes (facts about torch's format): `*.raw.json.gz` is a list of `[time_ns, action, bytes, category]`
events (time -1: tensors that existed before profiling; bytes negative when memory is released), and `*.json`
/ `*.json.gz` is `[times_us, sizes]` with one row of per-category byte counts per time. Category indices are
torch's memory-profiler order below.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

from stepscope.analysis.memory._untrusted import BIG, Int62, check_total
from stepscope.analysis.memory.model import DeviceMemory, MemoryReport
from stepscope.errors import InputError
from stepscope.units import fmt_bytes

# Index in the raw file -> name (torch's plotting order; the last one is "no category known").
CATEGORIES = (
    "parameter",
    "optimizer_state",
    "input",
    "temporary",
    "activation",
    "gradient",
    "autograd_detail",
    "unknown",
)


def downsample(values: np.ndarray, max_points: int) -> np.ndarray:
    """Indices of at most `max_points` points that keep the shape: the first, the last, and each bucket's
    minimum and maximum (so the peak is always kept)."""
    n = len(values)
    if n <= max_points:
        return np.arange(n)
    buckets = max(1, (max_points - 2) // 2)
    edges = np.linspace(0, n, buckets + 1).astype(np.int64)
    keep = {0, n - 1}
    for lo, hi in itertools.pairwise(edges):
        if hi > lo:
            chunk = values[lo:hi]
            keep.add(int(lo + np.argmin(chunk)))
            keep.add(int(lo + np.argmax(chunk)))
    return np.array(sorted(keep), dtype=np.int64)


def category_name(index: int) -> str:
    return CATEGORIES[index] if 0 <= index < len(CATEGORIES) else f"category_{index}"


def analyze_timeline(obj: Sequence[Any], *, source: str = "", max_points: int = 400) -> MemoryReport:
    """Peak allocated bytes, its time, the bytes per category at the peak, and the downsampled timeline."""
    coalesced = (
        len(obj) == 2
        and all(isinstance(x, (list, tuple)) for x in obj)
        and (not obj[1] or isinstance(obj[1][0], (list, tuple)))
        and (not obj[0] or not isinstance(obj[0][0], (list, tuple)))
    )
    try:
        if coalesced:
            t, table = _int_array(obj[0], 1), _int_array(obj[1], 2)
            if t is None or table is None:  # not plain integers: validate each (the message names the first)
                data = msgspec.convert(obj, tuple[list[Int62], list[list[Int62]]])
                t, table = np.array(data[0], dtype=np.int64), _ragged(data[1])
            check_total(source, "sizes", table)
            times, levels, cats = _coalesced(t, table)
        else:
            events = _int_array(obj, 2)
            if events is None or events.shape[1:] != (4,):
                events = np.array(
                    msgspec.convert(obj, list[tuple[Int62, Int62, Int62, Int62]]), dtype=np.int64
                ).reshape(-1, 4)
            check_total(source, "sizes", events[:, 2])
            times, levels, cats = _raw(events)
    except msgspec.ValidationError as exc:
        raise InputError(source, f"not a memory timeline: {exc}") from None
    except ValueError as exc:
        raise InputError(source, f"not a memory timeline: {exc}") from None

    notes = []
    if not len(levels):
        notes.append(
            "empty memory timeline (torch writes an empty one when exported with device='cpu:0'; use 'cpu')"
        )
        return MemoryReport(source, "memory_timeline", [], [], [], notes)
    if int(levels.min()) < 0:
        notes.append("the timeline goes below zero: it does not start with everything that was allocated")
    peak_i = int(np.argmax(levels))
    keep = downsample(levels, max_points)
    at_peak = {category_name(c): int(col[peak_i]) for c, col in sorted(cats.items()) if col[peak_i]}
    device = DeviceMemory(
        device=-1,
        reserved=None,
        allocated=None,
        active=None,
        requested=None,
        inactive_split=None,
        peak_allocated=int(levels[peak_i]),
        peak_reserved=None,
        peak_t_us=int(times[peak_i]),
        trace_entries=len(obj) if not coalesced else len(times),
        trace_baseline=0,
        segments=None,
        timeline_t_us=times[keep].tolist(),
        timeline_allocated=levels[keep].tolist(),
        timeline_reserved=None,
        time_is_index=False,
        ooms=[],
        categories_at_peak=dict(sorted(at_peak.items(), key=lambda kv: -kv[1])),
        timeline_by_category={
            category_name(c): col[keep].tolist() for c, col in sorted(cats.items()) if col.any()
        },
    )
    notes.append(f"memory timeline: {fmt_bytes(int(levels[-1]))} still allocated at the end")
    return MemoryReport(source, "memory_timeline", [device], [], [], notes)


def _int_array(obj: Any, ndim: int) -> np.ndarray | None:
    """`obj` (lists of integers, `ndim` deep, rows of one length) as one int64 array in one conversion, its
    values within Int62's bounds; None when it is anything else (the caller then validates it item by item)."""
    if not len(obj):
        return None
    try:
        arr = np.array(obj)
    except (ValueError, TypeError, OverflowError):  # ragged rows, or numbers past int64
        return None
    if arr.ndim != ndim or arr.dtype.kind not in "iu" or arr.dtype.itemsize > 8:
        return None
    arr = arr.astype(np.int64, copy=False)
    if max(int(arr.max()), -int(arr.min())) > BIG:
        return None
    return arr


def _ragged(rows: list[list[int]]) -> np.ndarray:
    if not rows:
        return np.zeros((0, 1), dtype=np.int64)
    table = np.zeros((len(rows), max(1, max(len(row) for row in rows))), dtype=np.int64)
    for i, row in enumerate(rows):
        table[i, : len(row)] = row
    return table


def _raw(arr: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict[int, np.ndarray]]:
    if not len(arr):
        return np.zeros(0, np.int64), np.zeros(0, np.int64), {}
    arr = arr[np.argsort(arr[:, 0], kind="stable")]
    t = arr[:, 0]
    known = t[t >= 0]
    t = np.where(t < 0, known.min() if len(known) else 0, t)  # pre-existing tensors: at the start
    # Levels are read after the last event of each timestamp, as torch's own plot does.
    ends = np.flatnonzero(np.r_[t[1:] != t[:-1], True])
    levels = np.cumsum(arr[:, 2])[ends]
    cats = {int(c): np.cumsum(np.where(arr[:, 3] == c, arr[:, 2], 0))[ends] for c in np.unique(arr[:, 3])}
    times_us = (t[ends] - t[0]) // 1000
    return times_us, levels, cats


def _coalesced(t: np.ndarray, table: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict[int, np.ndarray]]:
    if len(t) != len(table):
        raise ValueError(f"{len(t)} times but {len(table)} rows of sizes")
    if not len(t):
        return np.zeros(0, np.int64), np.zeros(0, np.int64), {}
    # Column 0 is torch's padding; column k >= 1 is category k - 1.
    cats = {k - 1: table[:, k] for k in range(1, table.shape[1])}
    if table[:, 0].any():
        cats[len(CATEGORIES) - 1] = cats.get(len(CATEGORIES) - 1, 0) + table[:, 0]
    return t - t.min(), table.sum(axis=1), cats
