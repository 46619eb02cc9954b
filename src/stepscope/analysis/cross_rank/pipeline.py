"""Pipeline parallelism across ranks: the stages and their order from who sends to whom, the micro-batches and
the schedule where the trace shows them, each stage's bubble, and the schedule's theoretical bubble beside it
(docs/analysis.md, "Pipeline parallel").

- Peers: each c10d::send / c10d::recv_ names its peer as a rank of its process group; the group is the one of
  the rank's groups (its pg_config, the run's record of the process groups) in which every peer is another
  member, and, where several are, the one whose peers answer: they send to or receive from this rank.
- Order: in each step a stage's first point-to-point op is the receive of its first micro-batch's activations
  from the previous stage; the first stage has none, and starts with a send to the next. A rank's `prev` is the
  peer of its first op when that is a receive (most steps decide), its `next` the other peer it exchanges with.
  Stages are numbered along `next` from each first stage, as long as the next stage takes this one as its
  prev. A rank that exchanges with a third rank besides its prev and next (a ring: context parallelism's
  send / recv) is no stage, unless pipelining's ranges show it running several stages (an interleaved schedule
  loops back from the last rank to the first).
- Bubble: a stage's wait (its point-to-point time that no compute covers, per_rank/parallelism/pipeline.py) over its steps'
  time; `theoretical_bubble` = (p - 1) / (v m + p - 1) for p stages, m micro-batches, v stages per rank.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import msgspec
import numpy as np

from stepscope.analysis.per_rank.parallelism.pipeline import RankPipeline
from stepscope.analysis.stats import median


class PipelineStage(msgspec.Struct):
    """One rank's stage of the pipeline, over its analysed steps; times are per step (mean)."""

    rank: int
    stage: int | None  # position from the first stage (0); null when the ranks before it were not traced
    prev: int | None  # the rank it receives activations from; null for the first stage
    next: int | None  # the rank it sends activations to; null for the last stage
    bubble: float  # share of the step the stage waits on its neighbours with no compute (0 to 1)
    bubble_ms: float  # that wait, per step
    compute_ms: float  # compute per step
    wait_ms: float  # point-to-point communication per step (sends and receives, overlapped by compute or not)
    steps: list[int]  # the ProfilerStep numbers measured
    step_bubble_ms: list[float]  # the wait with no compute in each of them


class Pipeline(msgspec.Struct):
    """The pipeline-parallel view of a job: null in `analyze --json` when no pipeline is recognised."""

    stages: list[PipelineStage]  # by stage, then rank
    num_stages: int | None  # p: the length of the chain of stages, where every rank of it was traced
    micro_batches: int | None  # m per step, where visible
    micro_batches_source: str | None  # "ranges" (pipelining's Forward / PP: ranges), "p2p" (the first stage's
    # sends to the next per step: one tensor per micro-batch), null unknown
    schedule: str | None  # GPipe, forward only, interleaved, zero bubble, multi-stage: as pipelining's ranges
    # show it; null when they show none (Schedule1F1B leaves no range)
    stages_per_rank: int  # v: stages each rank runs (PP: actions), else 1
    theoretical_bubble: float | None  # (p - 1) / (v m + p - 1); null without p and m, or for zero bubble
    worst_stage_rank: int | None  # the rank of the stage with the largest bubble
    notes: list[str] = []


def pipeline_analysis(parts: Mapping[int, RankPipeline | None]) -> Pipeline | None:
    """The pipeline of the job from every rank's part (None where a rank issued no point-to-point op with a
    peer); None when no chain of stages is recognised."""
    ranks = {r: p for r, p in parts.items() if p is not None and (p.has_peers or p.recorded)}
    if not ranks:
        return None
    notes: list[str] = []
    peers = _global_peers({r: p for r, p in ranks.items() if p.has_peers}, notes)
    prev: dict[int, int | None] = {}
    nxt: dict[int, int | None] = {}
    for r, part in ranks.items():
        if part.recorded:
            # capture's record of the rank's stage names its neighbours
            prev[r], nxt[r] = part.stage_prev, part.stage_next
            continue
        if r not in peers:
            continue
        before, after, extra = _neighbours(part, peers[r])
        if extra and len({stage for stage, _, _ in part.actions}) < 2:
            # (a rank running several stages exchanges with more ranks: an interleaved schedule's loop)
            notes.append(
                f"rank {r}: it exchanges point-to-point messages with ranks {', '.join(map(str, sorted(extra)))} "
                "besides its neighbours (a ring?): not a pipeline stage"
            )
            continue
        prev[r], nxt[r] = before, after
    chains = _chains(prev, nxt)
    if not any(len(c) > 1 or _alone(c[0], prev, nxt) for c in chains):
        return None
    # (numbered from a first stage only: after an untraced one, the position is unknown)
    stage_of = {r: i for chain in chains if prev[chain[0]] is None for i, r in enumerate(chain)}
    stage_of.update({r: part.stage_index for r, part in ranks.items() if part.stage_index is not None})
    complete = [c for c in chains if prev[c[0]] is None and (nxt[c[-1]] is None or nxt[c[-1]] == c[0])]
    lengths = {len(c) for c in complete}
    p = lengths.pop() if len(lengths) == 1 else None
    recorded_counts = {part.num_stages for part in ranks.values() if part.num_stages is not None}
    if len(recorded_counts) == 1:
        p = recorded_counts.pop()
    if any(part.recorded for part in ranks.values()):
        notes.append(
            "stages and their order as capture recorded them (torch.distributed.pipelining's stages)"
        )
    inferred = sorted(r for r, part in ranks.items() if part.inferred)
    if inferred:
        notes.append(
            f"rank{'s' if len(inferred) > 1 else ''} {', '.join(map(str, inferred))}: the point-to-point ops "
            "name no peer (recorded without shapes); each rank belongs to one group of two, whose other member "
            "is taken as the peer"
        )
    stages = [_stage(ranks[r], stage_of.get(r), prev[r], nxt[r]) for r in sorted(prev)]
    stages.sort(key=lambda s: (s.stage if s.stage is not None else 1 << 30, s.rank))
    m, m_source = _micro_batches(ranks, [c[0] for c in chains], nxt, peers)
    schedule, v = _schedule(ranks)
    theoretical = None
    if p is not None and m is not None and schedule != "zero bubble":
        theoretical = round((p - 1) / (v * m + p - 1), 4)
    worst = max(stages, key=lambda s: s.bubble_ms).rank if stages else None
    for r in sorted(set(ranks) - set(peers)):
        notes.append(f"rank {r}: the process group of its point-to-point ops is unknown; left out")
    return Pipeline(stages, p, m, m_source, schedule, v, theoretical, worst, notes)


def pipeline_notices(parts: Mapping[int, RankPipeline | None]) -> list[str]:
    """What keeps ranks out of the pipeline view: point-to-point ops that name no peer."""
    out = []
    for r, part in sorted(parts.items()):
        if part is not None and part.unnamed and not part.has_peers and not part.recorded:
            out.append(
                f"rank {r}: its {part.unnamed} point-to-point ops (c10d::send / c10d::recv_) name no peer: no "
                "pipeline view without the recorded inputs (record_shapes=True)"
            )
    return out


def _global_peers(ranks: Mapping[int, RankPipeline], notes: list[str]) -> dict[int, np.ndarray]:
    """Each rank's op peers as global ranks (see the module's docstring); ranks whose group stays unknown are left
    out."""
    options: dict[int, list[np.ndarray]] = {}
    for r, part in ranks.items():
        groups = part.groups or ([tuple(range(part.world_size))] if part.world_size else [])
        found: list[np.ndarray] = []
        for group in groups:
            if int(part.op_peer.max()) >= len(group):
                continue
            mapped = np.asarray(group, dtype=np.int64)[part.op_peer]
            if (mapped != r).all() and not any(np.array_equal(mapped, f) for f in found):
                found.append(mapped)
        options[r] = found
    out: dict[int, np.ndarray] = {}
    for r, found in options.items():
        if len(found) == 1:
            out[r] = found[0]
            continue

        def answered(mapped: np.ndarray, r: int = r) -> int:
            return sum(
                any(r in set(m.tolist()) for m in options.get(int(s), ())) for s in set(mapped.tolist())
            )

        scores = [answered(f) for f in found]
        if scores and scores.count(max(scores)) == 1:
            out[r] = found[scores.index(max(scores))]
        elif len(found) > 1:
            notes.append(f"rank {r}: its point-to-point peers fit {len(found)} of its process groups")
    return out


def _neighbours(part: RankPipeline, peers: np.ndarray) -> tuple[int | None, int | None, set[int]]:
    """(prev, next, the other peers) of one rank: its first op in each step decides prev (see the module's
    docstring)."""
    votes: Counter[int | None] = Counter()
    for j in np.unique(part.op_step).tolist():
        first = int(np.flatnonzero(part.op_step == j)[0])
        votes[None if part.op_send[first] else int(peers[first])] += 1
    prev = votes.most_common(1)[0][0]
    others = [int(s) for s in dict.fromkeys(peers.tolist()) if s != prev]
    if not others:
        return prev, None, set()
    sends = [int(s) for s in dict.fromkeys(peers[part.op_send].tolist()) if s != prev]
    nxt = (sends or others)[0]
    return prev, nxt, set(others) - {nxt}


def _alone(r: int, prev: Mapping[int, int | None], nxt: Mapping[int, int | None]) -> bool:
    """A stage whose neighbours were not traced (one rank of the pipeline profiled)."""
    return (prev[r] is not None or nxt[r] is not None) and prev[r] not in prev and nxt[r] not in prev


def _chains(prev: Mapping[int, int | None], nxt: Mapping[int, int | None]) -> list[list[int]]:
    """The chains of traced stages along `next`, each from a first stage (no prev) or, where the first stage
    was not traced, from a rank whose prev was not traced; a chain goes on to its next stage only when that one
    takes it as its prev; a loop back to the chain's start ends it."""
    starts = [r for r in sorted(prev) if prev[r] is None or prev[r] not in prev]
    chains = []
    for start in starts:
        chain = [start]
        # a link holds when the next stage receives its first micro-batch from this one
        while (n := nxt[chain[-1]]) is not None and n in prev and prev[n] == chain[-1] and n not in chain:
            chain.append(n)
        chains.append(chain)
    return chains


def _stage(part: RankPipeline, stage: int | None, prev: int | None, nxt: int | None) -> PipelineStage:
    n = max(len(part.steps), 1)
    total = float(part.step_ns.sum())
    return PipelineStage(
        rank=part.rank,
        stage=stage,
        prev=prev,
        next=nxt,
        bubble=round(float(part.wait_ns.sum()) / total, 4) if total > 0 else 0.0,
        bubble_ms=round(float(part.wait_ns.sum()) / n / 1e6, 3),
        compute_ms=round(float(part.compute_ns.sum()) / n / 1e6, 3),
        wait_ms=round(float(part.p2p_ns.sum()) / n / 1e6, 3),
        steps=[int(x) for x in part.steps.tolist()],
        step_bubble_ms=[round(float(x) / 1e6, 3) for x in part.wait_ns.tolist()],
    )


def _micro_batches(
    ranks: Mapping[int, RankPipeline],
    firsts: list[int],
    nxt: Mapping[int, int | None],
    peers: Mapping[int, np.ndarray],
) -> tuple[int | None, str | None]:
    """m per step: from pipelining's ranges, else from the first stage's sends to the next stage."""
    actions = {mb for part in ranks.values() for _, kind, mb in part.actions if kind == "F"}
    if actions:
        return max(actions) + 1, "ranges"
    counts = {n for part in ranks.values() for n in part.forwards if n > 0}
    if len(counts) == 1:
        return counts.pop(), "ranges"
    for r in firsts:
        part, to = ranks[r], nxt[r]
        if r not in peers or to is None or part.op_send.size == 0:
            continue
        per_step = [
            int(((part.op_step == j) & part.op_send & (peers[r] == to)).sum()) for j in range(len(part.steps))
        ]
        if per_step and min(per_step) > 0:
            return int(median([float(c) for c in per_step])), "p2p"
    return None, None


def _schedule(ranks: Mapping[int, RankPipeline]) -> tuple[str | None, int]:
    """(schedule, stages per rank) as pipelining's ranges show them."""
    actions = [part.actions for part in ranks.values() if part.actions]
    if actions:
        v = max(len({stage for stage, _, _ in a}) for a in actions)
        kinds = {kind for a in actions for _, kind, _ in a}
        if kinds & {"I", "W"}:
            return "zero bubble", v
        return ("interleaved" if v > 1 else "multi-stage"), v
    parts = list(ranks.values())
    if all(part.forwards and min(part.forwards) > 0 for part in parts):
        if all(all(part.fill_drain) for part in parts):
            return "GPipe", 1
        if all(part.backwards == 0 for part in parts):
            return "forward only", 1
    return None, 1
