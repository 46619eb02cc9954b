"""Snapshot dicts in torch's documented `torch.cuda.memory._snapshot()` format, with numbers chosen so the
expected results can be worked out by hand (see the comments)."""

from __future__ import annotations

import copy
from typing import Any

MiB = 1024 * 1024
KiB = 1024


def frame(filename: str, line: int, name: str) -> dict[str, Any]:
    return {"filename": filename, "line": line, "name": name}


LINEAR = frame("/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py", 125, "forward")
STEP = frame("/home/u/train.py", 40, "step")
MAIN = frame("/home/u/train.py", 90, "main")
BUFFER = frame("/home/u/model.py", 12, "make_buffer")
SETUP = frame("/home/u/train.py", 30, "setup")
OOM_SITE = frame("/home/u/train.py", 55, "step")
CPP = frame("/pytorch/c10/cuda/CUDACachingAllocator.cpp", 1200, "c10::cuda::malloc")


def block(
    size: int, requested: int, state: str, frames: list[dict[str, Any]], address: int = 0
) -> dict[str, Any]:
    return {"size": size, "requested_size": requested, "address": address, "state": state, "frames": frames}


def entry(
    action: str, size: int, t: int, addr: int = 0, frames: list[dict[str, Any]] | None = None, **extra: Any
):
    return {
        "action": action,
        "addr": addr,
        "size": size,
        "stream": 0,
        "time_us": t,
        "frames": frames or [],
        **extra,
    }


def segment(device: int, total: int, kind: str, blocks: list[dict[str, Any]], address: int) -> dict[str, Any]:
    return {
        "device": device,
        "address": address,
        "total_size": total,
        "stream": 0,
        "segment_type": kind,
        "segment_pool_id": (0, 0),
        "allocated_size": sum(b["size"] for b in blocks if b["state"] == "active_allocated"),
        "active_size": sum(b["size"] for b in blocks if b["state"].startswith("active")),
        "blocks": blocks,
    }


def snapshot() -> dict[str, Any]:
    """Device 0 at snapshot time:

    segment A, 20 MiB large: 8 MiB live (linear.py <- train.py:40), 4 MiB live (model.py:12), 8 MiB inactive
    segment B,  2 MiB small: 1 MiB live (train.py:40), 512 KiB awaiting free, 512 KiB inactive
    segment C,  4 MiB large: 4 MiB inactive (whole segment free: releasable, not fragmentation)

    reserved 26 MiB; allocated 13 MiB; active 13.5 MiB; inactive split 8.5 MiB (A and B hold live blocks);
    requested 8,000,000 + 4 MiB + 1,000,000.

    History (time_us from 1000): levels without baseline 8, 14, 18, 12, 16, 12 MiB; it ends at 12 MiB while
    13.5 MiB is active, so 1.5 MiB was allocated before it: peak 19.5 MiB at t=1030 (30 us after the start).
    Reserved: +20 MiB, +4 MiB = 24 MiB net, 26 MiB at the end -> baseline 2 MiB, peak 26 MiB.
    """
    seg_a = segment(
        0,
        20 * MiB,
        "large",
        [
            block(8 * MiB, 8_000_000, "active_allocated", [CPP, LINEAR, STEP, MAIN], address=0x1000_0000),
            block(4 * MiB, 4 * MiB, "active_allocated", [BUFFER, SETUP, MAIN], address=0x1080_0000),
            block(8 * MiB, 8 * MiB, "inactive", [], address=0x10C0_0000),
        ],
        address=0x1000_0000,
    )
    seg_b = segment(
        0,
        2 * MiB,
        "small",
        [
            block(1 * MiB, 1_000_000, "active_allocated", [STEP, MAIN], address=0x2000_0000),
            block(512 * KiB, 512 * KiB, "active_awaiting_free", [STEP], address=0x2010_0000),
            block(512 * KiB, 512 * KiB, "inactive", [], address=0x2018_0000),
        ],
        address=0x2000_0000,
    )
    seg_c = segment(
        0, 4 * MiB, "large", [block(4 * MiB, 4 * MiB, "inactive", [], address=0x3000_0000)], 0x3000_0000
    )
    trace = [
        entry("segment_alloc", 20 * MiB, 1000, 0x1000_0000),
        entry("alloc", 8 * MiB, 1010, 0x1000_0000, [LINEAR, STEP]),
        entry("alloc", 6 * MiB, 1020, 0x1080_0000, [STEP]),
        entry("alloc", 4 * MiB, 1030, 0x10E0_0000, [BUFFER]),
        entry("free_requested", 6 * MiB, 1040, 0x1080_0000),
        entry("free_completed", 6 * MiB, 1050, 0x1080_0000),
        {
            "action": "oom",
            "size": 100 * MiB,
            "device_free": 1 * MiB,
            "stream": 0,
            "time_us": 1060,
            "frames": [OOM_SITE],
        },
        entry("segment_alloc", 4 * MiB, 1070, 0x3000_0000),
        entry("alloc", 4 * MiB, 1080, 0x3000_0000, [STEP]),
        entry("free_requested", 4 * MiB, 1090, 0x3000_0000),
        entry("free_completed", 4 * MiB, 1100, 0x3000_0000),
    ]
    data = {"segments": [seg_a, seg_b, seg_c], "device_traces": [trace], "allocator_settings": {"x": 1}}
    return copy.deepcopy(data)  # callers may edit it; the frame constants are shared
