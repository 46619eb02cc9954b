"""Reading traces: the streaming decoder, the columnar TraceTable, and loading one file, a folder of ranks or a
run folder (`load_trace`).

The names below are this package's public API, imported on first use (importing the package costs nothing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stepscope._lazy import lazy_exports

if TYPE_CHECKING:
    from stepscope.analysis.read.loader import load_file, load_trace, run_folders, trace_files
    from stepscope.analysis.read.source import Source
    from stepscope.analysis.read.table import COLUMNS, GPU_CATEGORIES, MISSING, RankInfo, TraceTable

_EXPORTS = {
    "load_trace": "loader",
    "trace_files": "loader",
    "Source": "source",
    "run_folders": "loader",
    "load_file": "loader",
    "TraceTable": "table",
    "RankInfo": "table",
    "COLUMNS": "table",
    "MISSING": "table",
    "GPU_CATEGORIES": "table",
}

__all__ = [
    "COLUMNS",
    "GPU_CATEGORIES",
    "MISSING",
    "RankInfo",
    "Source",
    "TraceTable",
    "load_file",
    "load_trace",
    "run_folders",
    "trace_files",
]


__getattr__ = lazy_exports(__name__, _EXPORTS)
