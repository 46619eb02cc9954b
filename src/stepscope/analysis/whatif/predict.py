"""`stepscope whatif`: replay each rank's steps with measured durations, then with the selected work scaled, and
say what the step would take and which chain would bound it (docs/analysis.md, "Critical path and what-if").

Ranks are replayed together: a change on one rank reaches the others through the collectives they share
(couple.py); the job's step is its slowest rank's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec
import numpy as np

from stepscope.analysis.per_rank.comm.collectives import Instances, rank_instances
from stepscope.analysis.per_rank.prepare import prepare_rank
from stepscope.analysis.read.table import TraceTable
from stepscope.analysis.stats import t_quantile
from stepscope.analysis.whatif.couple import couple, replay_job
from stepscope.analysis.whatif.cpu_comm import rank_graph
from stepscope.analysis.whatif.fidelity import (
    REPLAY_TRUST_PCT,
    ReplayFidelity,
    approximate_text,
    fidelity,
    limits,
)
from stepscope.analysis.whatif.graph import RankGraph
from stepscope.analysis.whatif.path import PathStep, critical_path, job_critical_path
from stepscope.analysis.whatif.select import Selector, scaling_for

SCHEMA = "stepscope.whatif/1"


class RankWhatIf(msgspec.Struct):
    rank: int
    steps: int
    baseline_step_ms: float  # measured: the mean ProfilerStep of the window
    replayed_step_ms: float  # the replay with nothing changed
    predicted_step_ms: float  # the replay with the selected work scaled
    saving_ms: float  # replayed - predicted
    gpu_activities: int
    synchronizations: int
    critical_path: list[PathStep]  # of the predicted steps (the replayed ones when nothing is selected)
    replay: ReplayFidelity | None = None  # the replay with nothing changed against the measured steps
    # where a window of as many steps with the change would land (INTERVAL_LEVEL), from the spread of the
    # predicted steps; null with fewer than 2 steps
    predicted_low_ms: float | None = None
    predicted_high_ms: float | None = None


class WhatIfResult(msgspec.Struct):
    schema: str
    scale: list[str]
    baseline_step_ms: float | None  # the job's: its slowest rank's
    replayed_step_ms: float | None
    predicted_step_ms: float | None
    saving_ms: float | None
    replay_error_pct: float | None  # (replayed - baseline) / baseline
    ranks: list[RankWhatIf]
    notes: list[str]
    # the job's, across ranks (the predicted steps; the replayed ones when nothing is selected)
    critical_path: list[PathStep] = msgspec.field(default_factory=list)
    # a rank's replay is off its measured steps by more than REPLAY_TRUST_PCT: the prediction and the path are
    # approximate, for these reasons (fidelity.py)
    approximate: bool = False
    approximate_reasons: list[str] = msgspec.field(default_factory=list)
    # stream waits whose event no record names and whose timing names none keep their delays (events.py): the
    # prediction had each such wait held its activity until the last activity on another stream ended before it
    # (None: no such wait, or nothing selected), and how far that is from predicted_step_ms, in % of it
    unnamed_waits: int = 0
    predicted_if_waits_held_ms: float | None = None
    unnamed_waits_effect_pct: float | None = None
    # the job's predicted step (its slowest rank's in each step) as an interval: see RankWhatIf
    predicted_low_ms: float | None = None
    predicted_high_ms: float | None = None
    interval_note: str | None = None  # how the interval was made, or why there is none


def whatif(table: TraceTable, selectors: Sequence[Selector] = (), *, top: int = 5) -> WhatIfResult:
    """Replay every rank of `table` together (couple.py), measured and with `selectors` applied."""
    ranks: list[RankWhatIf] = []
    notes: list[str] = []
    graphs: dict[int, RankGraph] = {}
    instances: dict[int, Instances] = {}
    for rank in table.rank_ids():
        data = prepare_rank(table, rank)
        notes += [f"rank {rank}: {n}" for n in data.notes]
        world = table.ranks[rank].world_size if rank in table.ranks else None
        instances[rank] = rank_instances(data, world)
        graphs[rank] = rank_graph(data, instances[rank])
        notes += [f"rank {rank}: {n}" for n in graphs[rank].notes]
    coupling = couple(graphs, instances)
    base, forced = replay_job(graphs, coupling)
    scaled = base
    if selectors:
        scalings = {r: scaling_for(g, list(selectors)) for r, g in graphs.items()}
        for sel in selectors:
            if not any(s.matched.get(sel.text, 0) for s in scalings.values()):
                notes.append(
                    f"--scale {sel.text!r} matched nothing on any rank (no activity, region or synchronization "
                    "it names): the prediction is the replay unchanged by it"
                )
        scaled, forced_scaled = replay_job(graphs, coupling, scalings)
        forced = max(forced, forced_scaled)
    for rank, graph in graphs.items():
        measured = float(np.mean(graph.step_end - graph.step_start)) / 1e6
        replayed = float(np.mean(base[rank].step_ns)) / 1e6
        predicted = float(np.mean(scaled[rank].step_ns)) / 1e6
        ranks.append(
            RankWhatIf(
                rank=rank,
                steps=len(graph.step_start),
                baseline_step_ms=round(measured, 3),
                replayed_step_ms=round(replayed, 3),
                predicted_step_ms=round(predicted, 3),
                saving_ms=round(replayed - predicted, 3),
                gpu_activities=len(graph.gpu),
                synchronizations=len(graph.syncs),
                critical_path=critical_path(scaled[rank], top=top),
                replay=fidelity(rank, graph.step_end - graph.step_start, base[rank].step_ns, limits(graph)),
                **_bounds(
                    step_interval(predicted, len(scaled[rank].step_ns), step_spread([scaled[rank].step_ns]))
                ),
            )
        )
    if len(coupling):
        notes.append(f"{len(coupling)} collectives matched across ranks tie their replays")
    elif len(ranks) > 1:
        notes.append("no collective matched across ranks: each rank is replayed alone")
    if forced:
        notes.append(
            f"{forced} collectives were released before all their ranks arrived (orders of collectives the "
            "ranks' traces do not explain)"
        )
    job = max(ranks, key=lambda r: r.baseline_step_ms, default=None)
    slowest = max(ranks, key=lambda r: r.predicted_step_ms, default=None)
    unnamed = sum(g.unnamed_waits for g in graphs.values())
    held = effect = None
    reasons = [approximate_text(r.replay) for r in ranks if r.replay is not None and r.replay.approximate]
    if selectors and unnamed and slowest is not None and slowest.predicted_step_ms > 0:
        held = round(_waits_held(graphs, instances, selectors), 3)
        effect = round(100.0 * (held - slowest.predicted_step_ms) / slowest.predicted_step_ms, 3)
        notes.append(
            f"{unnamed} stream waits name no event and their timing names none, so their delays are kept: had "
            "each held its activity until the last activity on another stream ended before it started, the "
            f"prediction would be {held:g} ms instead of {slowest.predicted_step_ms:g} ms ({effect:+.1f}%)"
        )
        if abs(effect) > REPLAY_TRUST_PCT:
            reasons.append(
                f"the prediction moves {effect:+.1f}% if the {unnamed} stream waits without a record held their "
                "activities (the trace does not say which work they waited for)"
            )
    # (the job's step is its slowest rank's mean; how steps vary, from every rank)
    spread = step_spread([scaled[r].step_ns for r in graphs])
    job_steps = slowest.steps if slowest is not None else 0
    interval = step_interval(slowest.predicted_step_ms, job_steps, spread) if slowest is not None else None
    return WhatIfResult(
        schema=SCHEMA,
        scale=[s.text for s in selectors],
        baseline_step_ms=job.baseline_step_ms if job else None,
        replayed_step_ms=max(r.replayed_step_ms for r in ranks) if ranks else None,
        predicted_step_ms=slowest.predicted_step_ms if slowest else None,
        saving_ms=round(max(r.replayed_step_ms for r in ranks) - slowest.predicted_step_ms, 3)
        if slowest
        else None,
        replay_error_pct=(
            round(
                100 * (max(r.replayed_step_ms for r in ranks) - job.baseline_step_ms) / job.baseline_step_ms,
                3,
            )
            if job and job.baseline_step_ms
            else None
        ),
        ranks=ranks,
        notes=notes,
        critical_path=job_critical_path(scaled, coupling, top=top) if scaled else [],
        approximate=bool(reasons),
        approximate_reasons=reasons,
        unnamed_waits=unnamed,
        predicted_if_waits_held_ms=held,
        unnamed_waits_effect_pct=effect,
        **_bounds(interval),
        interval_note=interval_note(job_steps, spread, len(ranks)),
    )


UNBOUNDED_NS = 1 << 62  # an inference window that takes any earlier end (_waits_held)


def _waits_held(
    graphs: dict[int, RankGraph], instances: dict[int, Instances], selectors: Sequence[Selector]
) -> float:
    """The job's predicted step (its slowest rank's mean, ms) with every stream wait the trace leaves unnamed
    taken as a wait for the last activity to end on another stream before its activity started (the inference of
    events.py without its time window): what the missing records could change at most that way."""
    held: dict[int, RankGraph] = {}
    for rank, graph in graphs.items():
        assert graph.data is not None
        held[rank] = rank_graph(graph.data, instances[rank], UNBOUNDED_NS) if graph.unnamed_waits else graph
    coupling = couple(held, instances)
    scalings = {r: scaling_for(g, list(selectors)) for r, g in held.items()}
    scaled, _ = replay_job(held, coupling, scalings)
    return max(float(np.mean(r.step_ns)) / 1e6 for r in scaled.values())


INTERVAL_LEVEL = 0.9  # of the predicted step's interval


def step_spread(per_rank_ns: Sequence[np.ndarray]) -> tuple[float, int] | None:
    """(sd in ms, degrees of freedom) of a step around its rank's mean, pooled over the ranks (their machine's
    noise is one: a rank's few steps alone say little of it); None without two steps on some rank."""
    squares, values, groups = 0.0, 0, 0
    for steps in per_rank_ns:
        x = np.asarray(steps, dtype=np.float64) / 1e6
        if len(x):
            squares += float(((x - x.mean()) ** 2).sum())
            values += len(x)
            groups += 1
    df = values - groups
    return (math.sqrt(squares / df), df) if df >= 1 else None


def step_interval(mean_ms: float, steps: int, spread: tuple[float, int] | None) -> tuple[float, float] | None:
    """Where the mean of a window of `steps` steps would land with INTERVAL_LEVEL confidence, its steps varying
    as `spread` (step_spread) around `mean_ms`: Student's t prediction interval for a new sample's mean,
    mean +- t * sd * sqrt(2 / steps). None without a spread."""
    if spread is None or steps < 1:
        return None
    sd, df = spread
    half = t_quantile(0.5 + INTERVAL_LEVEL / 2, df) * sd * math.sqrt(2.0 / steps)
    return round(max(mean_ms - half, 0.0), 3), round(mean_ms + half, 3)


def interval_note(steps: int, spread: tuple[float, int] | None, ranks: int) -> str:
    if spread is None:
        return f"no interval: {steps} step(s) replayed, 2 needed to see how steps vary"
    sd, df = spread
    over = f"{ranks} ranks" if ranks > 1 else "the rank"
    return (
        f"{100 * INTERVAL_LEVEL:.0f}% interval of a window of {steps} steps with the change: the predicted steps "
        f"vary by {sd:.3g} ms around their rank's mean (pooled over {over}, Student's t with {df} degrees of "
        "freedom); a rerun varies as much, and more on a machine that is busier than it was"
    )


def _bounds(interval: tuple[float, float] | None) -> dict[str, float | None]:
    low, high = interval if interval is not None else (None, None)
    return {"predicted_low_ms": low, "predicted_high_ms": high}
