"""CUDA memory snapshots and memory timelines, read without unpickling arbitrary objects.

The names below are this package's public API, imported on first use (importing the package costs nothing).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stepscope.analysis.memory.model import DeviceMemory, MemoryReport, to_document
    from stepscope.analysis.memory.snapshot import analyze_memory_file, analyze_snapshot

_EXPORTS = {
    "analyze_memory_file": "snapshot",
    "analyze_snapshot": "snapshot",
    "MemoryReport": "model",
    "DeviceMemory": "model",
    "to_document": "model",
}

__all__ = [
    "DeviceMemory",
    "MemoryReport",
    "analyze_memory_file",
    "analyze_snapshot",
    "to_document",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
