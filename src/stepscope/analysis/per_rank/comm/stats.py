"""Per kind and process group of one rank's collectives (collectives.py's instances): the count, message size,
time, the waiting for peers and the bandwidth."""

from __future__ import annotations

import msgspec
import numpy as np

from stepscope.analysis import intervals as iv
from stepscope.analysis.per_rank.comm.collectives import Instances, wait_intervals
from stepscope.analysis.per_rank.comm_names import algorithm_bytes, bus_factor


class CollectiveStats(msgspec.Struct):
    """One kind of collective in one process group on one rank, over the analysed window."""

    rank: int
    kind: str
    group: str | None  # process-group name, null when unknown (group_source says how it is known)
    group_size: int | None
    count: int
    source: str  # kernel | backend_range | record_param_comms | c10d_op
    bytes: int | None  # input messages summed; null when the trace lacks a size
    time_ms: float | None  # summed duration of the instances
    time_source: str | None  # "device" (kernels), "cpu" (gloo/mpi/ucc range), "cpu enqueue", null
    wait_ms: float | None  # of time_ms, waiting for the last rank to arrive (null: not matched across ranks)
    transfer_ms: float | None  # time_ms - wait_ms; time_ms when not matched
    algbw_gbps: float | None  # algorithm bytes / transfer time (GB/s, 1e9 bytes)
    busbw_gbps: float | None  # algbw x nccl-tests' factor for the kind and group size
    algorithms: list[str]
    dtypes: list[str]
    dim: str | None = (
        None  # the group's mesh dimension ("tp"), else its description ("default_pg"), else null
    )
    # trace (record_param_comms) | capture (the group's gloo threads) | only group (the rank's one group) |
    # matched ranks (across ranks) | unknown
    group_source: str = "unknown"
    group_ranks: list[int] | None = None  # the group's ranks where known


def collective_stats(inst: Instances, wait_ns: np.ndarray | None = None) -> list[CollectiveStats]:
    """Per (kind, group) of one rank. `wait_ns`: per instance, the time spent waiting for peers (-1 where the
    instance was not matched across ranks; None: no matching at all). Times and waiting are unions in time
    over the instances; bandwidth is their bytes over the transfer time (the time less the waiting)."""
    if not len(inst):
        return []
    timed = inst.time_source is not None
    by_key: dict[tuple[str, str, str], list[int]] = {}
    # a group name means one group; unknown ones apart from those matched across ranks
    for i, key in enumerate(zip(inst.kind, inst.group, inst.group_source, strict=True)):
        by_key.setdefault(key, []).append(i)
    stats = []
    for (kind, group, _), idx in by_key.items():
        ix = np.array(idx, dtype=np.int64)
        sizes = inst.group_size[ix]
        size = int(sizes.max()) if (sizes > 0).any() else None
        in_b = inst.in_bytes[ix]
        total_bytes = int(in_b.sum()) if (in_b >= 0).all() else None
        # unions in time: instances of one kind may run at once (DDP's buckets)
        time_ns = iv.length(iv.merge(inst.start[ix], inst.end[ix])) if timed else None
        wait: int | None = None
        if wait_ns is not None and timed and (wait_ns[ix] >= 0).any():
            waits = np.full(len(inst), -1, dtype=np.int64)
            waits[ix] = wait_ns[ix]
            wait = iv.length(wait_intervals(inst, waits))
        transfer = None if time_ns is None else time_ns - (wait or 0)
        algbw = busbw = None
        if total_bytes is not None and transfer and inst.time_source != "cpu enqueue":
            algo = [algorithm_bytes(kind, int(inst.in_bytes[i]), _opt(inst.out_bytes[i]), size) for i in idx]
            if all(a is not None for a in algo):
                algbw = sum(a for a in algo if a is not None) / transfer  # bytes per ns = GB/s
                factor = bus_factor(kind, size) if size else None
                busbw = None if factor is None else algbw * factor
        stats.append(
            CollectiveStats(
                rank=inst.rank,
                kind=kind,
                group=group or None,
                group_size=size,
                count=len(idx),
                source=inst.source or "",
                bytes=total_bytes,
                time_ms=None if time_ns is None else round(time_ns / 1e6, 6),
                time_source=inst.time_source,
                wait_ms=None if wait is None else round(wait / 1e6, 6),
                transfer_ms=None if transfer is None else round(transfer / 1e6, 6),
                algbw_gbps=None if algbw is None else round(algbw, 6),
                busbw_gbps=None if busbw is None else round(busbw, 6),
                algorithms=sorted({inst.algorithm[i] for i in idx} - {""}),
                dtypes=sorted({inst.dtype[i] for i in idx} - {""}),
                dim=inst.dim[idx[0]],
                group_source=inst.group_source[idx[0]],
                group_ranks=None if (members := inst.group_ranks[idx[0]]) is None else list(members),
            )
        )
    return sorted(stats, key=lambda s: (-(s.time_ms or 0.0), -s.count, s.kind, s.group or ""))


def _opt(value: np.integer) -> int | None:
    return int(value) if value >= 0 else None
