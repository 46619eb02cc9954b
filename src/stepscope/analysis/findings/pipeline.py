"""`pipeline_bubble`: the stages of a pipeline wait on each other. Priced by the worst stage's bubble in each step
(its wait on its neighbours with no compute): the step of every stage lasts as long as the slowest stage's, so
every stage pays it. The action follows the evidence (docs/analysis.md, "Findings"):

1. the measured bubble is the schedule's own (within PIPELINE_NEAR_POINTS of (p - 1) / (v m + p - 1)): more
   micro-batches per step;
2. one stage computes PIPELINE_IMBALANCE times as long as another, and that difference is at least half of the
   worst stage's bubble beyond the theoretical one (all of it without one): balance the stages;
3. the schedule runs one stage per rank (GPipe, 1F1B): an interleaved or zero-bubble schedule;
4. otherwise: the point-to-point transfers themselves (the wait is neither the schedule's nor the compute's).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from stepscope.analysis.cross_rank.pipeline import Pipeline, PipelineStage
from stepscope.analysis.findings.pricing import Finding, Price, WindowSteps, priced
from stepscope.analysis.findings.rule import Rule
from stepscope.analysis.per_rank.prepare import RankDigest
from stepscope.units import fmt_ms, fmt_pct

PIPELINE_BUBBLE = Rule(
    "pipeline_bubble", "parallelism", "the worst stage's wait on its neighbours with no compute, in each step"
)
RULES = (PIPELINE_BUBBLE,)

PIPELINE_BUBBLE_MIN_PCT = 5.0  # the worst stage's bubble, % of the step, for the finding to hold in a step
PIPELINE_NEAR_POINTS = (
    5.0  # measured bubble within this many points of the theoretical one: the schedule's own
)
PIPELINE_IMBALANCE = 1.25  # the busiest stage computes this many times as long as the least busy one


def pipeline_findings(pipeline: Pipeline | None, ranks: Mapping[int, RankDigest]) -> list[Finding]:
    """`pipeline_bubble` for the job's pipeline, or nothing."""
    if pipeline is None or pipeline.worst_stage_rank is None:
        return []
    worst = pipeline.worst_stage_rank
    digest = ranks.get(worst)
    if digest is None:
        return []
    window = WindowSteps.of(digest)
    # in each of the worst stage's steps, the largest wait of any stage in the step of the same number
    numbers = np.asarray(digest.steps.number, dtype=np.int64)
    if len(numbers) != len(window):
        return []
    cost = np.zeros(len(window), dtype=np.int64)
    for s in pipeline.stages:
        at = dict(zip(s.steps, s.step_bubble_ms, strict=True))
        for j, n in enumerate(numbers.tolist()):
            cost[j] = max(cost[j], round(at.get(n, 0.0) * 1e6))
    price = Price(np.minimum(cost, window.length), window, PIPELINE_BUBBLE_MIN_PCT)
    stage = next(s for s in pipeline.stages if s.rank == worst)
    action = _action(pipeline, stage)
    theoretical = pipeline.theoretical_bubble
    beside = (
        f"; the schedule's theoretical bubble: {fmt_pct(100 * theoretical)}"
        if theoretical is not None
        else ""
    )
    found = priced(
        PIPELINE_BUBBLE.id,
        worst,
        price,
        PIPELINE_BUBBLE.priced_by,
        f"Pipeline stages wait on their neighbours with no compute for {fmt_ms(price.ms)} per step "
        f"({fmt_pct(price.pct)} of the step; the most on {_name(stage)}{beside}), and every "
        "stage's step lasts as long",
        action,
        {
            "stages": len(pipeline.stages),
            "num_stages": pipeline.num_stages,
            "micro_batches": pipeline.micro_batches,
            "schedule": pipeline.schedule,
            "worst_stage": stage.stage,
            "worst_bubble_pct": round(100 * stage.bubble, 2),
            "theoretical_bubble_pct": round(100 * theoretical, 2) if theoretical is not None else None,
            "bubble_pct_by_rank": ", ".join(f"{s.rank}: {100 * s.bubble:.1f}" for s in pipeline.stages),
            "compute_ms_by_rank": ", ".join(f"{s.rank}: {s.compute_ms:.3f}" for s in pipeline.stages),
        },
    )
    if found is None:
        return []
    found.ranks = sorted(s.rank for s in pipeline.stages)
    return [found]


def _name(stage: PipelineStage) -> str:
    """ "stage 1 (rank 3)", or "rank 3" where its position is unknown."""
    return f"stage {stage.stage} (rank {stage.rank})" if stage.stage is not None else f"rank {stage.rank}"


def _action(pipeline: Pipeline, worst: PipelineStage) -> str:
    """The one action the evidence points to (see the module's docstring)."""
    p, m, v = pipeline.num_stages, pipeline.micro_batches, pipeline.stages_per_rank
    theoretical = pipeline.theoretical_bubble
    near = theoretical is not None and 100 * (worst.bubble - theoretical) <= PIPELINE_NEAR_POINTS
    if near and theoretical is not None and p is not None and m is not None:
        more = (p - 1) / (v * 4 * m + p - 1)
        return (
            f"run more micro-batches per step: the schedule's bubble is (p - 1) / (v m + p - 1) = "
            f"{fmt_pct(100 * theoretical)} at m = {m}, {fmt_pct(100 * more)} at m = {4 * m}"
        )
    computes = [s for s in pipeline.stages if s.compute_ms > 0]
    step_ms = worst.bubble_ms / worst.bubble if worst.bubble > 0 else 0.0
    excess_ms = worst.bubble_ms - (theoretical or 0.0) * step_ms
    if len(computes) > 1:
        busy = max(computes, key=lambda s: s.compute_ms)
        idle = min(computes, key=lambda s: s.compute_ms)
        if busy.compute_ms >= PIPELINE_IMBALANCE * idle.compute_ms and (
            busy.compute_ms - idle.compute_ms >= 0.5 * excess_ms
        ):
            return (
                f"balance the stages: {_name(busy)} computes {fmt_ms(busy.compute_ms)} "
                f"per step against {fmt_ms(idle.compute_ms)} on {_name(idle)}; move "
                "layers off it"
            )
    if v == 1 and pipeline.schedule != "zero bubble":
        return (
            "use a schedule with several stages per rank, ScheduleInterleaved1F1B or "
            "ScheduleInterleavedZeroBubble (torch.distributed.pipelining), to shrink the fill and drain"
        )
    return "shorten the point-to-point transfers between stages (larger messages, a faster link or backend)"
