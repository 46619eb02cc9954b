"""Findings on the collectives of all ranks together: CPU-backend communication that takes a large share of the
step (`comm_bound`, priced by the transfer: the time in collectives less the waiting for peers), the time whose
waiting cannot be known (`comm_wait_unknown`), and instances far slower than their kind (`collective_slow`).

A rank's waiting in a collective is known only when the instance was matched with the instances of every rank of
its process group: with one rank traced (the default), a rank that waits for a slow peer all through the
collective looks exactly like a slow transfer. Such time is never priced; the finding says why and what to trace.
"""

from __future__ import annotations

import numpy as np

from stepscope.analysis import intervals as iv
from stepscope.analysis.cross_rank.distributed import Distributed
from stepscope.analysis.findings.comm_rank import COMM_BOUND
from stepscope.analysis.findings.pricing import Finding, price_of, price_per_step, priced
from stepscope.analysis.findings.rule import Rule
from stepscope.analysis.per_rank.comm.collectives import Instances
from stepscope.analysis.per_rank.comm_names import algorithm_bytes
from stepscope.analysis.per_rank.prepare import RankDigest
from stepscope.analysis.stats import quantile
from stepscope.units import fmt_ms, fmt_pct

# comm_bound on CPU backends (gloo): collective transfer time (waiting for peers left out), % of the step; the
# same share of collective time whose waiting is unknown makes comm_wait_unknown.
COMM_CPU_MIN_PCT = 10.0
# collective_slow: an instance whose bandwidth is below the reference of its kind and size by this factor ...
COLLECTIVE_SLOW_FACTOR = 10.0
COLLECTIVE_SLOW_MIN_INSTANCES = 3  # ... among at least this many instances of that kind and size ...
COLLECTIVE_SLOW_MIN_BYTES = 1 << 20  # ... of at least this size (smaller ones measure latency, not bandwidth)

TRACE_ALL = 'trace every rank (profiled_ranks="all", or --profiled-ranks all) to split waiting from transfer'


COMM_WAIT_UNKNOWN = Rule("comm_wait_unknown", "overview", "")
COLLECTIVE_SLOW = Rule(
    "collective_slow", "communication", "the transfer time beyond what the run's reference bandwidth needs"
)
RULES = (COMM_WAIT_UNKNOWN, COLLECTIVE_SLOW)  # (COMM_BOUND: comm_rank.py's, priced here on CPU backends)


def waiting_known(
    instances: dict[int, Instances], dist: Distributed, ranks: dict[int, RankDigest]
) -> dict[int, np.ndarray]:
    """Per rank, per instance: whether its waiting for peers is known, i.e. it was matched with the instances of
    every rank of its process group (the group's size from the trace, else the job's world size)."""
    seen = {r: np.zeros(len(inst), dtype=np.int64) for r, inst in instances.items()}
    for match_ranks, index in zip(dist.match.ranks, dist.match.index, strict=True):
        for r, i in zip(match_ranks.tolist(), index.tolist(), strict=True):
            seen[r][i] = len(match_ranks)
    known = {}
    for r, inst in instances.items():
        world = ranks[r].world_size if r in ranks else None
        size = np.where(inst.group_size > 0, inst.group_size, world or 0)
        known[r] = (dist.wait_ns[r] >= 0) & (seen[r] >= size)
    return known


def comm_findings(
    instances: dict[int, Instances], dist: Distributed, ranks: dict[int, RankDigest]
) -> list[Finding]:
    """`comm_bound` and `comm_wait_unknown` for CPU backends (GPU communication is judged per rank from the
    kernels), then `collective_slow`."""
    known = waiting_known(instances, dist, ranks)
    out: list[Finding] = []
    for rank, inst in sorted(instances.items()):
        data = ranks.get(rank)
        if data is None or inst.time_source != "cpu" or not len(inst):
            continue
        waits = np.clip(dist.wait_ns[rank], 0, inst.end - inst.start)
        for found in (
            _cpu_comm_bound(data, inst, known[rank], waits),
            _wait_unknown(data, inst, known[rank], len(ranks)),
        ):
            if found is not None:
                out.append(found)
    out.extend(_collective_slow(instances, dist.wait_ns, known, ranks))
    return out


def _cpu_comm_bound(
    data: RankDigest, inst: Instances, known: np.ndarray, waits: np.ndarray
) -> Finding | None:
    """The time some collective of the rank transfers data (a backend may run several at once: a union), over
    the instances whose waiting is known."""
    if not known.any():
        return None
    start, end = inst.start[known], inst.end[known]
    transfer = iv.merge(start + waits[known], end)
    price = price_of(data, transfer, min_pct=COMM_CPU_MIN_PCT)
    return priced(
        COMM_BOUND.id,
        data.rank,
        price,
        "time in which a CPU-backend collective transfers data (after the last rank arrived)",
        f"Collectives on the CPU backend take {fmt_ms(price.ms)} per step ({fmt_pct(price.pct)} of the step) "
        "besides waiting for peers",
        "send fewer or larger messages (gradient bucketing, no_sync over accumulation steps) or use a GPU backend",
        {
            "collectives": int(known.sum()),
            "collectives_ms_per_step": price.median_ms(iv.merge(start, end)),
            "waiting_ms_per_step": price.median_ms(iv.merge(start, start + waits[known])),
        },
    )


def _wait_unknown(data: RankDigest, inst: Instances, known: np.ndarray, traced: int) -> Finding | None:
    """Collective time whose waiting for peers cannot be told from transfer: said, never priced. Point-to-point
    ops are left out: they are never matched as collectives, and their waiting is a pipeline's bubble (the
    pipeline view's)."""
    p2p = np.fromiter((k in ("send", "recv") for k in inst.kind), dtype=bool, count=len(inst))
    unknown = ~known & ~p2p
    if not unknown.any():
        return None
    alone = iv.subtract(
        iv.merge(inst.start[unknown], inst.end[unknown]), iv.merge(inst.start[known], inst.end[known])
    )
    price = price_of(data, alone, min_pct=COMM_CPU_MIN_PCT)
    if price.severity is None:
        return None
    sizes = inst.group_size[unknown]
    size = int(sizes.max()) if (sizes > 0).any() else (data.world_size or 0)
    if size > traced:
        who = f"only {traced} of the {size} ranks of their process group {'is' if traced == 1 else 'are'} traced"
    else:
        who = "they could not be matched with the same collectives on the other ranks"
    return Finding(
        COMM_WAIT_UNKNOWN.id,
        "info",
        data.rank,
        f"Collectives on the CPU backend take {fmt_ms(price.ms)} per step ({fmt_pct(price.pct)} of the step)"
        f"{price.when()}, but {who}: how much of it this rank waits for slower peers cannot be told from the "
        f"transfer, so it is not priced; {TRACE_ALL}.",
        {
            "collectives": int(unknown.sum()),
            "comm_ms_per_step": round(price.ms, 3),
            "comm_pct_of_step": round(price.pct, 2),
            "step_ms": round(price.step_median_ns / 1e6, 3),
            "traced_ranks": traced,
            "group_size": size or None,
        },
        action=TRACE_ALL,
        steps_held=price.steps_held,
        steps=price.steps,
    )


def _collective_slow(
    instances: dict[int, Instances],
    wait_ns: dict[int, np.ndarray],
    known: dict[int, np.ndarray],
    ranks: dict[int, RankDigest],
) -> list[Finding]:
    """Instances whose bandwidth is far below the reference of the same kind and size across the run (only
    those whose waiting is known: the rest may be waiting, not moving data)."""
    samples: dict[tuple[str, int, int], list[tuple[int, int, float, int]]] = {}
    for rank, inst in instances.items():
        if inst.time_source not in ("device", "cpu"):
            continue
        waits = np.clip(wait_ns[rank], 0, None)
        for i in np.flatnonzero(known[rank]).tolist():
            size = int(inst.group_size[i])
            algo = algorithm_bytes(
                inst.kind[i],
                int(inst.in_bytes[i]) if inst.in_bytes[i] >= 0 else None,
                int(inst.out_bytes[i]) if inst.out_bytes[i] >= 0 else None,
                size if size > 0 else None,
            )
            transfer = int(inst.end[i] - inst.start[i]) - int(waits[i])
            if algo is None or algo < COLLECTIVE_SLOW_MIN_BYTES or transfer <= 0:
                continue
            bucket = (inst.kind[i], size, int(np.log2(algo)))
            samples.setdefault(bucket, []).append((rank, i, algo / transfer, transfer))
    # (rank, kind) -> per slow instance: (its index, time lost, its bandwidth, the reference)
    lost: dict[tuple[int, str], list[tuple[int, float, float, float]]] = {}
    for (kind, _, _), rows in samples.items():
        if len(rows) < COLLECTIVE_SLOW_MIN_INSTANCES:
            continue
        reference = quantile([bw for _, _, bw, _ in rows], 0.75)
        for rank, i, bw, transfer in rows:
            if bw * COLLECTIVE_SLOW_FACTOR <= reference:
                lost.setdefault((rank, kind), []).append((i, transfer * (1 - bw / reference), bw, reference))
    out = []
    for (rank, kind), slow in sorted(lost.items()):
        data = ranks.get(rank)
        if data is None:
            continue
        at = instances[rank].start[[x[0] for x in slow]]
        price = price_per_step(data, at, np.array([x[1] for x in slow]))
        worst = min(slow, key=lambda x: x[2] / x[3])
        found = priced(
            COLLECTIVE_SLOW.id,
            rank,
            price,
            "transfer time beyond what the reference bandwidth needs",
            f"{len(slow)} {kind} collectives on rank {rank} move data at {worst[2]:.3g} GB/s where the same "
            f"kind and size reach {worst[3]:.3g} GB/s elsewhere in the run ({worst[3] / worst[2]:.0f}x slower), "
            f"costing {fmt_ms(price.ms)} per step",
            "check that rank's links, NIC and NCCL settings (NCCL_DEBUG=INFO, NCCL_IB_HCA, the topology)",
            {
                "kind": kind,
                "slow_instances": len(slow),
                "slowest_gbps": round(worst[2], 4),
                "reference_gbps": round(worst[3], 4),
            },
        )
        if found is not None:
            out.append(found)
    return out
