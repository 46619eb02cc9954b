"""Offline trace analysis. Never imports torch, rich or stepscope.capture; analyzers return plain results.

Subpackages by concern: read/ (traces into a TraceTable), per_rank/ (one rank), cross_rank/ (across ranks, merge),
findings/ (rules priced in step time), diff/ (two runs), memory/ (snapshots), run/ (the run folder); analyze.py
runs a whole analysis, service.py answers each command for one input and its options, tasks.py runs work in
processes. (What a report page shows is gathered by stepscope.report.data.)

The names below are this package's public API, imported on first use (importing the package costs nothing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stepscope._lazy import lazy_exports

if TYPE_CHECKING:
    from stepscope.analysis.analyze import AnalysisResult, analyze
    from stepscope.analysis.diff.compare import diff_paths
    from stepscope.analysis.options import AnalysisOptions
    from stepscope.analysis.parallel import analyze_path
    from stepscope.analysis.per_rank.summary import summarize
    from stepscope.analysis.read.loader import load_trace
    from stepscope.analysis.run.folder import load_run
    from stepscope.analysis.service import analyze_source

_EXPORTS = {
    "analyze": "analyze",
    "AnalysisResult": "analyze",
    "load_trace": "read.loader",
    "load_run": "run.folder",
    "analyze_path": "parallel",
    "summarize": "per_rank.summary",
    "AnalysisOptions": "options",
    "analyze_source": "service",
    "diff_paths": "diff.compare",
}

__all__ = [
    "AnalysisOptions",
    "AnalysisResult",
    "analyze",
    "analyze_path",
    "analyze_source",
    "diff_paths",
    "load_run",
    "load_trace",
    "summarize",
]


__getattr__ = lazy_exports(__name__, _EXPORTS)
