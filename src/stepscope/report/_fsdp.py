"""FSDP's units as one table of the report model (the terminal's `analyze` and the page's Parallelism section
show the same): per rank and unit, the all-gathers and reduce-scatters per step and the exposed all-gather time."""

from __future__ import annotations

from typing import TYPE_CHECKING

from stepscope.report import columns as col
from stepscope.report.model import Cell, Table, table

if TYPE_CHECKING:
    from stepscope.analysis.per_rank.parallelism.fsdp import FsdpAnalysis

__all__ = ["fsdp_caption", "fsdp_table"]


def _count(n: float) -> Cell:
    return Cell(f"{n:g}", n)


def fsdp_table(fsdp: FsdpAnalysis, *, title: str = "") -> Table:
    """Every FSDP unit of every rank, in forward order."""
    return table(
        "fsdp-units",
        [
            col.RANK,
            col.FSDP_UNIT,
            col.ALL_GATHERS_PER_STEP,
            col.ALL_GATHER_BYTES_PER_STEP,
            col.ALL_GATHER_MS_PER_STEP,
            col.EXPOSED_ALL_GATHER_MS_PER_STEP,
            col.REDUCE_SCATTERS_PER_STEP,
            col.REDUCE_SCATTER_MS_PER_STEP,
        ],
        (
            [
                r.rank,
                u.unit,
                _count(u.all_gathers_per_step),
                u.all_gather_bytes_per_step,
                u.all_gather_ms_per_step,
                u.exposed_all_gather_ms_per_step,
                _count(u.reduce_scatters_per_step),
                u.reduce_scatter_ms_per_step,
            ]
            for r in fsdp.ranks
            for u in r.units
        ),
        caption=fsdp_caption(fsdp),
        title=title,
    )


def fsdp_caption(fsdp: FsdpAnalysis) -> str:
    """What the table's figures are, and each rank's exposed all-gather time per step in forward and backward."""
    lines = [
        f"FSDP{fsdp.version} units, each figure per step of the window; 'exposed': the all-gather time the "
        "rank's other work does not hide (docs/analysis.md, FSDP)."
    ]
    for r in fsdp.ranks:
        n = max(len(r.steps), 1)
        forward = sum(s.exposed_forward_ms or 0.0 for s in r.steps) / n
        backward = sum(s.exposed_backward_ms or 0.0 for s in r.steps) / n
        timed = any(s.exposed_all_gather_ms is not None for s in r.steps)
        if timed:
            lines.append(f"Rank {r.rank}: exposed all-gathers {forward:.3f} ms in forward, {backward:.3f} ms in "
                         "backward per step.")  # fmt: skip
        if r.unattributed:
            lines.append(f"Rank {r.rank}: {r.unattributed} collective(s) in no unit.")
    return " ".join(lines)
