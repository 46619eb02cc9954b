"""Analyze a CUDA memory snapshot (`torch.cuda.memory._dump_snapshot`) or a memory timeline's raw JSON
(`export_memory_timeline`) without trusting the file and without torch.

Snapshot facts used (torch's documented format): `segments` (one per cudaMalloc, with `device`,
`total_size`, `segment_type` and `blocks` of `size`, `requested_size`, `address`, `state`, `frames`) is the
allocator state when the snapshot was taken; `device_traces[device]` is the recorded history before it
(`alloc`, `free_requested`, `free_completed`, `segment_alloc`, `segment_free`, `oom`, ... entries with `addr`,
`size`, `frames` and, in recent torch, `time_us`). Frames are innermost first.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import msgspec
import numpy as np

from stepscope.analysis.memory._untrusted import Bytes62, FiniteTime, check_total, read_untrusted
from stepscope.analysis.memory.model import (
    CallSite,
    DeviceMemory,
    LiveBlock,
    MemoryReport,
    OomEvent,
    SegmentStats,
)
from stepscope.analysis.memory.timeline import analyze_timeline, downsample
from stepscope.errors import InputError

DEFAULT_TOP = 10
DEFAULT_MAX_POINTS = 400
STACK_DEPTH = 5

# Frames in these files are torch's own; a call site is the first frame outside them.
_LIBRARY_MARKERS = ("/torch/", "\\torch\\")
_NATIVE_SUFFIXES = (".cpp", ".cc", ".cu", ".cuh", ".c", ".h", ".hpp")
_ALLOC = frozenset({"alloc"})
_FREE = frozenset({"free_completed", "free"})  # "free": the pre-2.1 single free action
_SEG_ALLOC = frozenset({"segment_alloc", "segment_map"})
_SEG_FREE = frozenset({"segment_free", "segment_unmap"})
_ACTIVE_STATES = frozenset({"active_allocated", "active_awaiting_free"})
NO_STACK = "<no stack recorded>"


class _Frame(msgspec.Struct):
    filename: str = "??"
    line: int | None = None
    name: str = "??"


class _History(msgspec.Struct):
    real_size: Bytes62 = 0
    frames: list[_Frame] = []


class _Block(msgspec.Struct):
    size: Bytes62 = 0
    requested_size: Bytes62 | None = None
    address: int = 0
    state: str = "active_allocated"
    frames: list[_Frame] | None = None
    history: list[_History] = []  # snapshots before torch 2.1


# a CUDA device index: never negative (a negative one indexed device_traces from its end, or past it)
DeviceIndex = Annotated[int, msgspec.Meta(ge=0)]


class _Segment(msgspec.Struct):
    device: DeviceIndex = 0
    address: int = 0
    total_size: Bytes62 = 0
    segment_type: str = ""
    blocks: list[_Block] = []


class _TraceEntry(msgspec.Struct):
    action: str
    addr: int = 0
    size: Bytes62 = 0
    time_us: FiniteTime | None = None
    device_free: Bytes62 = 0
    frames: list[_Frame] = []


class _Snapshot(msgspec.Struct):
    segments: list[_Segment] = []
    device_traces: list[list[_TraceEntry]] = []


def analyze_memory_file(
    path: str | Path, *, top: int = DEFAULT_TOP, max_points: int = DEFAULT_MAX_POINTS
) -> MemoryReport:
    """Load a snapshot pickle / memory timeline JSON (gzip'd or not) safely and analyze it."""
    return analyze_memory_object(read_untrusted(path), source=str(path), top=top, max_points=max_points)


def analyze_memory_object(
    obj: Any, *, source: str, top: int = DEFAULT_TOP, max_points: int = DEFAULT_MAX_POINTS
) -> MemoryReport:
    """Dispatch on shape: a dict is a snapshot, a list is a memory timeline (raw or [times, sizes])."""
    if isinstance(obj, dict):
        if "segments" not in obj and "device_traces" not in obj:
            raise InputError(
                source, "not a CUDA memory snapshot: a dict without 'segments' or 'device_traces'"
            )
        return analyze_snapshot(obj, source=source, top=top, max_points=max_points)
    if isinstance(obj, (list, tuple)):
        return analyze_timeline(obj, source=source, max_points=max_points)
    raise InputError(source, f"not a memory snapshot or timeline: top-level {type(obj).__name__}")


def analyze_snapshot(
    snapshot: dict[str, Any],
    *,
    source: str = "",
    top: int = DEFAULT_TOP,
    max_points: int = DEFAULT_MAX_POINTS,
) -> MemoryReport:
    """Peak, segments, live blocks, call sites, fragmentation, timeline and OOMs of one snapshot dict."""
    try:
        snap = msgspec.convert(snapshot, _Snapshot)
    except msgspec.ValidationError as exc:
        raise InputError(source, f"not a CUDA memory snapshot: {exc}") from None

    devices = sorted({s.device for s in snap.segments} | {i for i, t in enumerate(snap.device_traces) if t})
    live: list[LiveBlock] = []
    for seg in snap.segments:
        for block in seg.blocks:
            if block.state == "active_allocated":
                live.append(_live_block(seg.device, block))
    notes = _notes(snap, live)
    results = []
    for device in devices:
        segments = [s for s in snap.segments if s.device == device]
        trace = snap.device_traces[device] if device < len(snap.device_traces) else []
        results.append(_device_memory(device, segments, trace, max_points, notes, source))
    live.sort(key=lambda b: (-b.size, b.device, b.address))
    return MemoryReport(
        source=source,
        kind="snapshot",
        devices=results,
        top_blocks=live[:top],
        top_sites=_top_sites(live, top),
        notes=notes,
    )


def format_frame(frame: _Frame) -> str:
    return f"{frame.filename}:{frame.line if frame.line is not None else '?'}:{frame.name}"


def _is_native(frame: _Frame) -> bool:
    return frame.filename in ("??", "") or frame.filename.endswith(_NATIVE_SUFFIXES)


def _site_and_stack(frames: Sequence[_Frame]) -> tuple[str, list[str]]:
    """The first Python frame outside torch (else the first Python frame) and up to STACK_DEPTH callers."""
    python = [f for f in frames if not _is_native(f)] or list(frames)
    if not python:
        return NO_STACK, []
    start = next((i for i, f in enumerate(python) if not any(m in f.filename for m in _LIBRARY_MARKERS)), 0)
    stack = [format_frame(f) for f in python[start : start + STACK_DEPTH]]
    return stack[0], stack


def _block_frames(block: _Block) -> tuple[list[_Frame], int]:
    if block.frames is not None:
        return block.frames, block.requested_size if block.requested_size is not None else block.size
    if block.history:
        return block.history[0].frames, block.history[0].real_size
    return [], block.requested_size if block.requested_size is not None else block.size


def _live_block(device: int, block: _Block) -> LiveBlock:
    frames, requested = _block_frames(block)
    site, stack = _site_and_stack(frames)
    return LiveBlock(device, block.address, block.size, requested, site, stack)


def _top_sites(live: list[LiveBlock], top: int) -> list[CallSite]:
    by_site: dict[str, list[LiveBlock]] = {}
    for block in live:
        by_site.setdefault(block.site, []).append(block)
    sites = [
        CallSite(site, sum(b.size for b in blocks), len(blocks), max(blocks, key=lambda b: b.size).stack)
        for site, blocks in by_site.items()
    ]
    sites.sort(key=lambda s: (-s.bytes, s.site))
    return sites[:top]


def _segment_stats(segments: list[_Segment]) -> SegmentStats | None:
    if not segments:
        return None
    sizes = [s.total_size for s in segments]
    large = sum(1 for s in segments if s.segment_type == "large")
    small = sum(1 for s in segments if s.segment_type == "small")
    return SegmentStats(len(sizes), sum(sizes), max(sizes), min(sizes), large, small)


def _device_memory(
    device: int,
    segments: list[_Segment],
    trace: list[_TraceEntry],
    max_points: int,
    notes: list[str],
    source: str,
) -> DeviceMemory:
    blocks = [b for s in segments for b in s.blocks]
    reserved = sum(s.total_size for s in segments)
    allocated = sum(b.size for b in blocks if b.state == "active_allocated")
    active = sum(b.size for b in blocks if b.state in _ACTIVE_STATES)
    requested = sum(_block_frames(b)[1] for b in blocks if b.state == "active_allocated")
    inactive_split = sum(
        b.size
        for s in segments
        if any(x.state in _ACTIVE_STATES for x in s.blocks)
        for b in s.blocks
        if b.state not in _ACTIVE_STATES
    )

    d_alloc = np.zeros(len(trace), dtype=np.int64)
    d_res = np.zeros(len(trace), dtype=np.int64)
    ooms: list[OomEvent] = []
    timed = bool(trace) and all(e.time_us is not None for e in trace)
    t0 = min(e.time_us for e in trace if e.time_us is not None) if timed else 0.0
    for i, e in enumerate(trace):
        if e.action in _ALLOC:
            d_alloc[i] = e.size
        elif e.action in _FREE:
            d_alloc[i] = -e.size
        elif e.action in _SEG_ALLOC:
            d_res[i] = e.size
        elif e.action in _SEG_FREE:
            d_res[i] = -e.size
        elif e.action == "oom":
            site, stack = _site_and_stack(e.frames)
            t = round(e.time_us - t0) if timed and e.time_us is not None else None
            ooms.append(OomEvent(device, t, e.size, e.device_free, site, stack))
    times = (
        np.array([round(e.time_us - t0) for e in trace if e.time_us is not None], dtype=np.int64)
        if timed
        else np.arange(1, len(trace) + 1, dtype=np.int64)
    )

    # History is bounded (max_entries): what was allocated before the first entry is the baseline, the
    # end state minus the net change of the trace, and at least what the trace later frees.
    check_total(source, "sizes in the snapshot", d_alloc, d_res, active, reserved)
    alloc_level, alloc_base = _levels(d_alloc, active if segments else None)
    res_level, res_base = _levels(d_res, reserved if segments else None)
    if trace and alloc_base > 0:
        notes.append(
            f"device {device}: {alloc_base} bytes were allocated before the recorded history starts "
            "(it is bounded by max_entries); the timeline starts from them"
        )
    t_all = np.concatenate([[0], times])
    a_all = np.concatenate([[alloc_base], alloc_level])
    r_all = np.concatenate([[res_base], res_level])
    peak_i = int(np.argmax(a_all))
    peak_alloc = max(int(a_all[peak_i]), active)
    keep = downsample(a_all, max_points)
    return DeviceMemory(
        device=device,
        reserved=reserved,
        allocated=allocated,
        active=active,
        requested=requested,
        inactive_split=inactive_split,
        peak_allocated=peak_alloc,
        peak_reserved=max(int(r_all.max()), reserved),
        peak_t_us=int(t_all[peak_i]) if trace else None,
        trace_entries=len(trace),
        trace_baseline=alloc_base,
        segments=_segment_stats(segments),
        timeline_t_us=t_all[keep].tolist() if trace else [],
        timeline_allocated=a_all[keep].tolist() if trace else [],
        timeline_reserved=r_all[keep].tolist() if trace else [],
        time_is_index=not timed,
        ooms=ooms,
    )


def _levels(deltas: np.ndarray, end_level: int | None) -> tuple[np.ndarray, int]:
    """Running level after each entry, and the level before the first one (never negative)."""
    running = np.cumsum(deltas)
    lowest = int(running.min()) if len(running) else 0
    net = int(running[-1]) if len(running) else 0
    base = max(0, -lowest, (end_level - net) if end_level is not None else 0)
    return running + base, base


def _notes(snap: _Snapshot, live: list[LiveBlock]) -> list[str]:
    notes = []
    if not snap.segments and not any(snap.device_traces):
        notes.append("empty snapshot: no segments and no trace entries (was anything allocated on the GPU?)")
    if not any(snap.device_traces):
        notes.append(
            "no allocation history (device_traces is empty): peaks are the state at snapshot time; record it "
            "with torch.cuda.memory._record_memory_history(stacks='python') or stepscope's memory_snapshot=True"
        )
    if live and all(b.site == NO_STACK for b in live):
        notes.append(
            "no stack frames on live blocks: history was not being recorded when they were allocated"
        )
    return notes
