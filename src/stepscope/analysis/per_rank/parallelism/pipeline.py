"""One rank's share of the pipeline-parallel view: per step, its time in point-to-point communication, the part of
it no compute covers (the stage's wait on its neighbours), its compute; the point-to-point ops it issued with their
peers; what `torch.distributed.pipelining`'s own ranges say (micro-batches, actions).

Definitions (docs/analysis.md, "Pipeline parallel"):

- point-to-point time: the union of the rank's send / recv collectives (the backend's ranges, `gloo:recv`, or
  kernels) and, without GPU activity, of the c10d ops that issued them (`c10d::send`, `c10d::recv_`: the thread
  is blocked in them; on a GPU they only enqueue the kernels);
- compute: the rank's computation kernels where it has GPU activity, else its CPU ops that are no communication
  (a c10d op, functional collective or record_param_comms, and what runs inside one);
- wait: point-to-point time that no compute covers, clipped to each ProfilerStep; on a CPU backend, the time its
  receives are in flight (gloo's `gloo:recv` ranges; without them, the `c10d::recv_` ops) that no compute covers. gloo's
  asynchronous send stays open until the receiver takes it, while the sender goes on with Python the trace does
  not show (measured on a 2-stage GPipe job: its send ranges uncovered by compute were 27-32% of the step, its
  waits on them in the schedule 21%, mostly elsewhere in time), whereas a schedule waits on each receive as soon
  as it posts it (that job's receive ranges uncovered by compute: 15.5% and 15.3% of the step; its own timing of
  those waits: 15.2% and 14.9%). The waits on sends are left out: the bubble is the stage's waiting to receive.

Peers come from the ops' recorded inputs (`args_peer`, record_shapes=True): a rank in the op's process group,
turned into a global rank across ranks (cross_rank/pipeline.py). Without them, an op of a rank that belongs to one
group of two takes the other member; and where capture recorded the rank's pipelining stage (its index, the stage
count, every stage's rank), the stage's neighbours come from that record.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import msgspec
import numpy as np

from stepscope.analysis import intervals as iv
from stepscope.analysis.per_rank.comm.collectives import Instances
from stepscope.analysis.per_rank.comm.groups import KnownGroups, parse_ranks
from stepscope.analysis.per_rank.comm_names import BACKEND_RANGE, cpu_collective
from stepscope.analysis.per_rank.kernels import COMMUNICATION
from stepscope.analysis.per_rank.prepare import RankData
from stepscope.analysis.read.messages import P2P_OPS
from stepscope.analysis.read.table import MISSING, TraceTable

P2P_KINDS = ("send", "recv")
# torch.distributed.pipelining's ranges: "Forward 3" / "Backward 3" (PipelineScheduleSingle: GPipe and the
# forward-only schedule) and "PP:1F3" (PipelineScheduleMulti: stage 1, forward, micro-batch 3)
SINGLE_RANGE = re.compile(r"^(Forward|Backward) (\d+)$")
ACTION_RANGE = re.compile(r"^PP:(\d+)([A-Z_]+?)(\d+)$")
_X = ord("X")


class RankPipeline(msgspec.Struct, eq=False):
    """The pipeline figures of one rank; per-step arrays follow `steps` (ProfilerStep numbers); times in ns."""

    rank: int
    steps: np.ndarray
    step_ns: np.ndarray
    p2p_ns: np.ndarray  # point-to-point time
    wait_ns: np.ndarray  # of it, the part no compute covers
    compute_ns: np.ndarray
    # the c10d point-to-point ops in the window, by start: their step (index into steps), send or recv, and peer
    # as the op gives it (a rank of its process group)
    op_step: np.ndarray
    op_send: np.ndarray
    op_peer: np.ndarray
    groups: list[tuple[int, ...]]  # the member lists of the process groups this rank belongs to
    world_size: int | None
    # pipelining's ranges: per step, the distinct micro-batches of Forward ranges, and whether it has Forward and
    # Backward ranges, every Forward before the first Backward; the (stage, action, micro-batch) of PP: actions
    forwards: list[int] = msgspec.field(default_factory=list)
    fill_drain: list[bool] = msgspec.field(default_factory=list)
    backwards: int = 0
    actions: list[tuple[int, str, int]] = msgspec.field(default_factory=list)
    unnamed: int = 0  # point-to-point ops whose peer the trace does not give (recorded without record_shapes)
    inferred: int = 0  # of those, the ops whose peer is the other member of the rank's one group of two
    # the one stage this rank runs as capture recorded it (PipelineStageRecord, via known_groups' "pipeline"):
    # its index, the stage count and the ranks of its neighbours; null where not recorded
    stage_index: int | None = None
    num_stages: int | None = None
    stage_prev: int | None = None
    stage_next: int | None = None

    @property
    def has_peers(self) -> bool:
        return bool(len(self.op_peer))

    @property
    def recorded(self) -> bool:
        return self.stage_index is not None


def rank_pipeline(
    data: RankData, instances: Instances, known_groups: KnownGroups | None = None
) -> RankPipeline | None:
    """The pipeline figures of one prepared rank; None when it issued no point-to-point op in its window. Ops
    without a peer take the other member of the rank's group where it belongs to one group of two members and
    no other (who else could it exchange with); a rank whose ops still lack peers and whose stage capture did
    not record is returned with `unnamed` counting them and no op."""
    table = data.table
    names = table.columns["name"]
    p2p_name = table.names_matching(lambda n: n in P2P_OPS, key="p2p_ops", among=names)
    rows = np.flatnonzero(p2p_name[names] & (table.columns["ph"] == _X))
    ts, dur = table.columns["ts"], table.columns["dur"]
    rows = rows[(ts[rows] >= data.lo) & (ts[rows] < data.hi)]
    if not len(rows) or not len(data.steps):
        return None
    info = table.ranks.get(data.rank)
    groups = _groups(data.rank, info.process_groups if info else [], known_groups)
    world_size = info.world_size if info else None
    recorded = _recorded_stage(data.rank, known_groups)
    all_rows = np.sort(rows)
    peers = np.asarray(table.columns["args_peer"][rows], dtype=np.int64)
    unnamed = int((peers == MISSING).sum())
    inferred = 0
    pair = _only_pair(data.rank, groups, world_size)
    if unnamed and pair is not None:
        peers = np.where(peers == MISSING, pair, peers)
        inferred, unnamed = unnamed, 0
    rows, peers = rows[peers != MISSING], peers[peers != MISSING]
    if not len(rows) and recorded is None:
        z = np.zeros(0, dtype=np.int64)
        return RankPipeline(data.rank, z, z, z, z, z, z, z.astype(bool), z, [], None, unnamed=unnamed)
    order = np.argsort(ts[rows], kind="stable")
    rows, peers = rows[order], peers[order]
    starts, ends = data.steps.start, data.steps.end
    step_of = np.clip(np.searchsorted(starts, ts[rows], side="right") - 1, 0, len(starts) - 1)
    send = np.array([table.names[int(names[r])] == "c10d::send" for r in rows.tolist()], dtype=bool)

    is_p2p = np.array([k in P2P_KINDS for k in instances.kind], dtype=bool)
    # on a GPU the ops only enqueue the kernels, which are the wait; on the CPU the thread is blocked in them
    ops = all_rows if not data.has_gpu else all_rows[:0]
    p2p = iv.merge(
        np.concatenate((instances.start[is_p2p], ts[ops])),
        np.concatenate((instances.end[is_p2p], ts[ops] + dur[ops])),
    )
    compute = _compute(data)
    if data.has_gpu:
        waiting = iv.subtract(p2p, compute)
    else:
        # a CPU backend's asynchronous send stays open until the receiver takes it, while the sender goes on (in
        # Python the trace does not show): only the receives in flight are waiting (see the module's docstring)
        is_recv = np.array([k == "recv" for k in instances.kind], dtype=bool)
        # (the backend's receive ranges where the trace has them, else the c10d ops that issued the receives)
        recv_ops = all_rows[:0]
        if not is_recv.any():
            recv_ops = all_rows[
                np.array([table.names[int(names[r])] != "c10d::send" for r in all_rows.tolist()])
            ]
        receiving = iv.merge(
            np.concatenate((instances.start[is_recv], ts[recv_ops])),
            np.concatenate((instances.end[is_recv], ts[recv_ops] + dur[recv_ops])),
        )
        waiting = iv.subtract(receiving, compute)
    forwards, fill_drain, backwards, actions = _ranges(table, starts, ends)
    stage_index, num_stages, stage_prev, stage_next = recorded or (None, None, None, None)
    return RankPipeline(
        rank=data.rank,
        steps=np.asarray(data.steps.number, dtype=np.int64),
        step_ns=(ends - starts).astype(np.int64),
        p2p_ns=iv.covered_within(p2p, starts, ends),
        wait_ns=iv.covered_within(waiting, starts, ends),
        compute_ns=iv.covered_within(compute, starts, ends),
        op_step=step_of.astype(np.int64),
        op_send=send,
        op_peer=peers,
        groups=groups,
        world_size=world_size,
        forwards=forwards,
        fill_drain=fill_drain,
        backwards=backwards,
        actions=actions,
        unnamed=unnamed,
        inferred=inferred,
        stage_index=stage_index,
        num_stages=num_stages,
        stage_prev=stage_prev,
        stage_next=stage_next,
    )


def _only_pair(rank: int, groups: list[tuple[int, ...]], world_size: int | None) -> int | None:
    """The peer of any point-to-point op of `rank`, as a rank of the op's group, where the rank belongs to one
    group of two members and to no larger one (without a record of groups: a world of two); else None."""
    shared = {g for g in groups if len(g) > 1}
    if not shared and world_size == 2:
        shared = {(0, 1)}
    if len(shared) != 1:
        return None
    (group,) = shared
    if len(group) != 2 or rank not in group:
        return None
    return 1 - group.index(rank)


def _recorded_stage(rank: int, known: KnownGroups | None) -> tuple[int, int, int | None, int | None] | None:
    """(stage index, stage count, previous stage's rank, next stage's rank) of the one stage `rank` runs, from
    capture's record (known_groups' "pipeline": {"stage_ranks": [...]}); None where not recorded, or where the
    rank runs several stages (an interleaved schedule: pipelining's ranges tell those)."""
    for facts in (known or {}).values():
        pipe = facts.get("pipeline") if isinstance(facts, Mapping) else None
        stage_ranks = pipe.get("stage_ranks") if isinstance(pipe, Mapping) else None
        if not isinstance(stage_ranks, list) or not all(type(r) is int for r in stage_ranks):
            continue
        mine = [i for i, r in enumerate(stage_ranks) if r == rank]
        if len(mine) != 1:
            continue
        i, n = mine[0], len(stage_ranks)
        return i, n, stage_ranks[i - 1] if i > 0 else None, stage_ranks[i + 1] if i + 1 < n else None
    return None


def _compute(data: RankData) -> iv.Intervals:
    """The rank's compute: its computation GPU activity where it has some, else its CPU ops less communication."""
    if data.has_gpu:
        gpu = data.gpu_all.select(data.gpu_all.kind != COMMUNICATION)
        return iv.merge(gpu.start, gpu.end)
    table = data.table
    names = table.columns["name"]
    comm_name = table.names_matching(_communication, key="pipeline_comm", among=names)
    rows = table.complete_rows("cpu_op", "user_annotation")
    ts, end = table.columns["ts"][rows], table.columns["ts"][rows] + table.columns["dur"][rows]
    comm = comm_name[names[rows]]
    cpu_op = table.columns["cat"][rows] == table.cat_id("cpu_op")
    ops = iv.merge(ts[cpu_op & ~comm], end[cpu_op & ~comm])
    # (what runs inside a c10d op is communication; a backend's range, `gloo:send`, is not subtracted: gloo
    # opens it on the training thread for as long as an asynchronous send lasts, compute going on meanwhile)
    return iv.subtract(ops, iv.merge(ts[cpu_op & comm], end[cpu_op & comm]))


def _communication(name: str) -> bool:
    return (
        cpu_collective(name) is not None or name.startswith("c10d::") or BACKEND_RANGE.match(name) is not None
    )


def _ranges(
    table: TraceTable, starts: np.ndarray, ends: np.ndarray
) -> tuple[list[int], list[bool], int, list[tuple[int, str, int]]]:
    """pipelining's ranges in each step: the micro-batches of its Forward ranges, whether every Forward range
    starts before the first Backward range; the count of Backward ranges; the PP: actions."""
    names = table.columns["name"]
    single = table.names_matching(SINGLE_RANGE.match, key="pp_single", among=names)
    action = table.names_matching(ACTION_RANGE.match, key="pp_action", among=names)
    rows = table.complete_rows("user_annotation")
    rows = rows[single[names[rows]] | action[names[rows]]]
    ts = table.columns["ts"]
    forwards = [set[int]() for _ in starts]
    first_backward = [np.iinfo(np.int64).max] * len(starts)
    last_forward = [np.iinfo(np.int64).min] * len(starts)
    backwards = 0
    actions: list[tuple[int, str, int]] = []
    for row in rows.tolist():
        t = int(ts[row])
        j = int(np.searchsorted(starts, t, side="right")) - 1
        if j < 0 or t >= ends[j]:
            continue
        name = table.names[int(names[row])]
        match = SINGLE_RANGE.match(name)
        if match is None:
            m = ACTION_RANGE.match(name)
            if m is not None:
                actions.append((int(m.group(1)), m.group(2), int(m.group(3))))
            continue
        if match.group(1) == "Forward":
            forwards[j].add(int(match.group(2)))
            last_forward[j] = max(last_forward[j], t)
        else:
            backwards += 1
            first_backward[j] = min(first_backward[j], t)
    fill_drain = [
        bool(f) and b != np.iinfo(np.int64).max and last < b
        for f, last, b in zip(forwards, last_forward, first_backward, strict=True)
    ]
    return [len(f) for f in forwards], fill_drain, backwards, actions


def _groups(
    rank: int, pg_config: list[dict[str, object]], known: KnownGroups | None
) -> list[tuple[int, ...]]:
    """The member lists of the process groups `rank` belongs to (its pg_config, the known groups), each once."""
    out: list[tuple[int, ...]] = []
    listed = [g.get("ranks") for g in pg_config] + [g.get("ranks") for g in (known or {}).values()]
    for value in listed:
        ranks = parse_ranks(value)
        if ranks and rank in ranks and ranks not in out:
            out.append(ranks)
    return out
