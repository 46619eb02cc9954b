"""The pipeline-parallel view (analyze's `pipeline`) as a table of stages and one line beside it, for the terminal
and the report's Parallelism section. Formats only; every number comes computed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from stepscope.report import columns as col
from stepscope.report.model import Table, table
from stepscope.units import fmt_pct

if TYPE_CHECKING:
    from stepscope.analysis.cross_rank.pipeline import Pipeline


def pipeline_table(pipeline: Pipeline, *, title: str = "") -> Table:
    """One row per stage: its rank, the ranks before and after it, its bubble (share of the step and per step),
    compute and point-to-point time per step."""
    return table(
        "pipeline-stages",
        [
            col.STAGE,
            col.RANK,
            col.PREV_RANK,
            col.NEXT_RANK,
            col.BUBBLE,
            col.BUBBLE_PER_STEP,
            col.COMPUTE_PER_STEP,
            col.P2P_PER_STEP,
        ],
        (
            [
                s.stage,
                s.rank,
                s.prev,
                s.next,
                100 * s.bubble,
                s.bubble_ms,
                s.compute_ms,
                s.wait_ms,
            ]
            for s in pipeline.stages
        ),
        caption="Each stage's bubble: the share of its step it waits on its neighbours (point-to-point "
        "communication) with no compute; send+recv: all its point-to-point time, overlapped or not.",
        filter=False,
        title=title,
    )


def pipeline_line(pipeline: Pipeline) -> str:
    """The pipeline's shape in one line: stages, micro-batches, schedule, the theoretical bubble."""
    p = "?" if pipeline.num_stages is None else str(pipeline.num_stages)
    if pipeline.micro_batches is None:
        m = "micro-batches unknown"
    else:
        by = {"ranges": "pipelining's ranges", "p2p": "the first stage's sends"}.get(
            pipeline.micro_batches_source or "", "?"
        )
        m = f"{pipeline.micro_batches} micro-batches a step (from {by})"
    schedule = pipeline.schedule or "schedule not shown by the trace"
    if pipeline.stages_per_rank > 1:
        schedule += f", {pipeline.stages_per_rank} stages per rank"
    theoretical = (
        f"theoretical bubble (p - 1) / (v m + p - 1) = {fmt_pct(100 * pipeline.theoretical_bubble)}"
        if pipeline.theoretical_bubble is not None
        else "theoretical bubble unknown"
    )
    return f"{p} stages, {m}; {schedule}; {theoretical}"


def pipeline_page_table(pipeline: Pipeline | None) -> Table | None:
    """The stages' table for the page's Parallelism section, its caption led by the pipeline's line and notes;
    None without a pipeline."""
    if pipeline is None:
        return None
    out = pipeline_table(pipeline, title="Pipeline stages")
    out.caption = " ".join([f"{pipeline_line(pipeline)}.", *pipeline.notes, out.caption])
    return out
