"""Analyses across ranks: matching collectives, stragglers, the pipeline's stages (`pipeline_analysis`), and the
merged trace for Perfetto (`merge_traces`).

The names below are this package's public API, imported on first use (importing the package costs nothing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stepscope._lazy import lazy_exports

if TYPE_CHECKING:
    from stepscope.analysis.cross_rank.distributed import Straggler, cross_rank_analysis
    from stepscope.analysis.cross_rank.merge import merge_traces
    from stepscope.analysis.cross_rank.merge_select import alignment_table
    from stepscope.analysis.cross_rank.pipeline import Pipeline, pipeline_analysis
    from stepscope.analysis.cross_rank.straggler import GroupStraggler

_EXPORTS = {
    "cross_rank_analysis": "distributed",
    "Straggler": "distributed",
    "GroupStraggler": "straggler",
    "merge_traces": "merge",
    "alignment_table": "merge_select",
    "Pipeline": "pipeline",
    "pipeline_analysis": "pipeline",
}

__all__ = [
    "GroupStraggler",
    "Pipeline",
    "Straggler",
    "alignment_table",
    "cross_rank_analysis",
    "merge_traces",
    "pipeline_analysis",
]


__getattr__ = lazy_exports(__name__, _EXPORTS)
