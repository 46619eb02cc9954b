"""CUDA memory snapshots and memory timelines, read without unpickling arbitrary objects.

The names below are this package's public API, imported on first use (importing the package costs nothing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stepscope._lazy import lazy_exports

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


__getattr__ = lazy_exports(__name__, _EXPORTS)
