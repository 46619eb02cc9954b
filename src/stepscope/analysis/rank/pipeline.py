"""One rank's share of the pipeline-parallel view: per step, its time in point-to-point communication, the part of
it no compute covers (the stage's wait on its neighbours), its compute; the point-to-point ops it issued with their
peers; what `torch.distributed.pipelining`'s own ranges say (micro-batches, actions).

Definitions (docs/analysis.md, "Pipeline parallel"):

- point-to-point time: the union of the rank's send / recv collectives (the backend's ranges, `gloo:recv`, or
  kernels) and, without GPU activity, of the c10d ops that issued them (`c10d::send`, `c10d::recv_`: the thread
  is blocked in them; on a GPU they only enqueue the kernels);
- compute: the rank's computation kernels where it has GPU activity, else its CPU ops that are no communication
  (a c10d op, functional collective or record_param_comms, and what runs inside one);
- wait: point-to-point time that no compute covers, clipped to each ProfilerStep.

Peers come from the ops' recorded inputs (`args_peer`, record_shapes=True): a rank in the op's process group,
turned into a global rank across ranks (ranks/pipeline.py).
"""

from __future__ import annotations

import re

import msgspec
import numpy as np

from stepscope.analysis import intervals as iv
from stepscope.analysis.rank.collectives import Instances
from stepscope.analysis.rank.comm_names import BACKEND_RANGE, cpu_collective
from stepscope.analysis.rank.groups import KnownGroups, parse_ranks
from stepscope.analysis.rank.kernels import COMMUNICATION
from stepscope.analysis.rank.prepare import RankData
from stepscope.analysis.read.table import MISSING, P2P_OPS, TraceTable

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

    @property
    def has_peers(self) -> bool:
        return bool(len(self.op_peer))


def rank_pipeline(
    data: RankData, instances: Instances, known_groups: KnownGroups | None = None
) -> RankPipeline | None:
    """The pipeline figures of one prepared rank; None when it issued no point-to-point op in its window (one whose
    ops all lack a peer is returned with `unnamed` counting them and nothing else)."""
    table = data.table
    names = table.columns["name"]
    p2p_name = table.names_matching(lambda n: n in P2P_OPS, key="p2p_ops", among=names)
    rows = np.flatnonzero(p2p_name[names] & (table.columns["ph"] == _X))
    ts, dur = table.columns["ts"], table.columns["dur"]
    rows = rows[(ts[rows] >= data.lo) & (ts[rows] < data.hi)]
    peers = np.asarray(table.columns["args_peer"][rows], dtype=np.int64)
    if not len(rows) or not len(data.steps):
        return None
    unnamed = int((peers == MISSING).sum())
    rows, peers = rows[peers != MISSING], peers[peers != MISSING]
    if not len(rows):
        z = np.zeros(0, dtype=np.int64)
        return RankPipeline(data.rank, z, z, z, z, z, z, z.astype(bool), z, [], None, unnamed=unnamed)
    order = np.argsort(ts[rows], kind="stable")
    rows, peers = rows[order], peers[order]
    starts, ends = data.steps.start, data.steps.end
    step_of = np.clip(np.searchsorted(starts, ts[rows], side="right") - 1, 0, len(starts) - 1)
    send = np.array([table.names[int(names[r])] == "c10d::send" for r in rows.tolist()], dtype=bool)

    is_p2p = np.array([k in P2P_KINDS for k in instances.kind], dtype=bool)
    # on a GPU the ops only enqueue the kernels, which are the wait; on the CPU the thread is blocked in them
    ops = rows if not data.has_gpu else rows[:0]
    p2p = iv.merge(
        np.concatenate((instances.start[is_p2p], ts[ops])),
        np.concatenate((instances.end[is_p2p], ts[ops] + dur[ops])),
    )
    compute = _compute(data)
    waiting = iv.subtract(p2p, compute)
    forwards, fill_drain, backwards, actions = _ranges(table, starts, ends)
    info = table.ranks.get(data.rank)
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
        groups=_groups(data.rank, info.process_groups if info else [], known_groups),
        world_size=info.world_size if info else None,
        forwards=forwards,
        fill_drain=fill_drain,
        backwards=backwards,
        actions=actions,
        unnamed=unnamed,
    )


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
