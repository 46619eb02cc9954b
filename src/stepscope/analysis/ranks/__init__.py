"""Analyses across ranks: matching collectives, stragglers, and the merged trace for Perfetto (`merge_traces`).

The names below are this package's public API, imported on first use (importing the package costs nothing).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stepscope.analysis.ranks.distributed import Straggler, cross_rank_analysis
    from stepscope.analysis.ranks.merge import merge_traces
    from stepscope.analysis.ranks.merge_select import alignment_table

_EXPORTS = {
    "cross_rank_analysis": "distributed",
    "Straggler": "distributed",
    "merge_traces": "merge",
    "alignment_table": "merge_select",
}

__all__ = [
    "Straggler",
    "alignment_table",
    "cross_rank_analysis",
    "merge_traces",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
