"""Analyses of one rank: steps, top ops and kernels (`summarize`), the time breakdown, idle time per stream,
communication overlap, collectives, the exposed communication, FSDP's units, and the per-step overview.

The names below are this package's public API, imported on first use (importing the package costs nothing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stepscope._lazy import lazy_exports

if TYPE_CHECKING:
    from stepscope.analysis.per_rank.breakdown import kernel_type_breakdown, temporal_breakdown
    from stepscope.analysis.per_rank.comm.collectives import rank_instances
    from stepscope.analysis.per_rank.comm.exposed import exposed_communication
    from stepscope.analysis.per_rank.comm.stats import collective_stats
    from stepscope.analysis.per_rank.idle import idle_by_stream
    from stepscope.analysis.per_rank.overlap import comm_compute_overlap
    from stepscope.analysis.per_rank.overview import step_categories
    from stepscope.analysis.per_rank.parallelism.fsdp import FsdpAnalysis, fsdp_rank
    from stepscope.analysis.per_rank.prepare import RankData, prepare_rank
    from stepscope.analysis.per_rank.steps import find_steps, step_table
    from stepscope.analysis.per_rank.summary import SUMMARY_SCHEMA, RankSummary, Summary, summarize

_EXPORTS = {
    "summarize": "summary",
    "Summary": "summary",
    "RankSummary": "summary",
    "SUMMARY_SCHEMA": "summary",
    "find_steps": "steps",
    "step_table": "steps",
    "prepare_rank": "prepare",
    "RankData": "prepare",
    "temporal_breakdown": "breakdown",
    "kernel_type_breakdown": "breakdown",
    "idle_by_stream": "idle",
    "comm_compute_overlap": "overlap",
    "collective_stats": "comm.stats",
    "rank_instances": "comm.collectives",
    "step_categories": "overview",
    "exposed_communication": "comm.exposed",
    "fsdp_rank": "parallelism.fsdp",
    "FsdpAnalysis": "parallelism.fsdp",
}

__all__ = [
    "SUMMARY_SCHEMA",
    "FsdpAnalysis",
    "RankData",
    "RankSummary",
    "Summary",
    "collective_stats",
    "comm_compute_overlap",
    "exposed_communication",
    "find_steps",
    "fsdp_rank",
    "idle_by_stream",
    "kernel_type_breakdown",
    "prepare_rank",
    "rank_instances",
    "step_categories",
    "step_table",
    "summarize",
    "temporal_breakdown",
]


__getattr__ = lazy_exports(__name__, _EXPORTS)
