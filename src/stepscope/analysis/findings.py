"""Findings: rules that turn the numbers of one rank (or of all ranks) into advice, each with its evidence.

Every threshold is a named constant below and documented in docs/analysis.md ("Findings"). Percentages of the
*window* are of the analysed step time; percentages of the *span* are of the GPU span of the temporal breakdown.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import msgspec
import numpy as np

from stepscope.analysis import _intervals as iv
from stepscope.analysis._rank import RankData
from stepscope.analysis._stats import quantile
from stepscope.analysis.breakdown import Temporal
from stepscope.analysis.collectives import Instances
from stepscope.analysis.comm_names import algorithm_bytes
from stepscope.analysis.distributed import Straggler
from stepscope.analysis.idle import StreamIdle
from stepscope.analysis.kernels import MEMORY
from stepscope.analysis.overlap import CommOverlap
from stepscope.analysis.steps import DATALOADER_RE, ns_to_us, pct, region_union

# data_loader_stall: the loader takes at least this share of the window ...
DATALOADER_MIN_PCT = 5.0
# ... and the GPU is idle for at least this share of the loader time (always true without GPU activity).
DATALOADER_GPU_IDLE_MIN_PCT = 50.0
DATALOADER_HIGH_PCT = 20.0
# launch_bound: GPU idle >= this share of the span, host_wait >= this share of stream idle time, and at least
# this share of the kernels (and LAUNCH_BOUND_MIN_KERNELS of them) shorter than SHORT_KERNEL_NS.
LAUNCH_BOUND_IDLE_MIN_PCT = 20.0
LAUNCH_BOUND_HOST_WAIT_MIN_PCT = 50.0
LAUNCH_BOUND_SHORT_MIN_PCT = 50.0
LAUNCH_BOUND_MIN_KERNELS = 10
SHORT_KERNEL_NS = 10_000
# host_bound: the same idle and host_wait conditions with longer kernels; high from this idle share on. Not
# reported together with data_loader_stall, which already explains the wait.
HOST_BOUND_HIGH_IDLE_PCT = 50.0
# communication_bound: communication not hidden by computation >= this share of the span (high from the second).
COMM_EXPOSED_MIN_PCT = 10.0
COMM_EXPOSED_HIGH_PCT = 30.0
# sync_points / pageable_copies: reported whenever present; severity by their share of the window / span.
SYNC_MEDIUM_PCT = 2.0
SYNC_HIGH_PCT = 10.0
PAGEABLE_MEDIUM_PCT = 5.0
# tiny_kernels: at least TINY_KERNEL_MIN_COUNT kernels shorter than TINY_KERNEL_NS, making up this share of all.
TINY_KERNEL_NS = 5_000
TINY_KERNEL_MIN_COUNT = 100
TINY_KERNEL_MIN_SHARE_PCT = 50.0
# straggler: slowest rank's mean step time exceeds the fastest's by at least this much.
# straggler: reported by distributed.py (STRAGGLER_MIN_PCT there); high from this delay, % of the step
STRAGGLER_HIGH_PCT = 20.0
# comm_bound on CPU backends (gloo): collective transfer time (waiting for peers left out), % of the step
COMM_CPU_MIN_PCT = 10.0
# poor_overlap: communication kernels cover at least this share of the span, and overlap less than ...
POOR_OVERLAP_MIN_COMM_PCT = 5.0
POOR_OVERLAP_MAX_PCT = 30.0
# collective_slow: an instance whose bandwidth is below the reference of its kind and size by this factor ...
COLLECTIVE_SLOW_FACTOR = 10.0
COLLECTIVE_SLOW_MIN_INSTANCES = 3  # ... among at least this many instances of that kind and size ...
COLLECTIVE_SLOW_MIN_BYTES = (
    1 << 20
)  # ... of at least this size (smaller ones measure latency, not bandwidth) ...
COLLECTIVE_SLOW_MIN_PCT = 1.0  # ... costing at least this share of the rank's step time
COLLECTIVE_SLOW_HIGH_PCT = 10.0

SYNC_CALL_RE = re.compile(r"^(?:cuda|hip|cu)(Device|Stream|Event|Ctx)Synchroni[sz]e")
_SYNC_KINDS = ("Device", "Stream", "Event", "Ctx")  # SYNC_CALL_RE's group 1
MEMCPY_CALL_RE = re.compile(r"^(?:cuda|hip|cu)Memcpy")
ITEM_OP_NAMES = ("aten::_local_scalar_dense", "aten::item")

_X = ord("X")

Evidence = dict[str, float | int | str | None]


class Finding(msgspec.Struct):
    """One piece of advice: what, how bad, which rank, one sentence, and the numbers behind it."""

    id: str
    severity: str  # "high" | "medium" | "low" | "info"
    rank: int | None
    message: str
    evidence: Evidence


def rank_findings(
    data: RankData,
    temporal: Temporal | None,
    idle: Sequence[StreamIdle],
    overlap: CommOverlap | None,
) -> list[Finding]:
    """Every rule that applies to one rank, in a stable order."""
    out: list[Finding] = []
    for rule in (
        _data_loader_stall,
        _launch_bound,
        _comm_bound,
        _poor_overlap,
        _sync_points,
        _pageable,
        _tiny_kernels,
    ):
        found = rule(data, temporal, idle, overlap)
        if found is not None:
            out.append(found)
    if any(f.id == "data_loader_stall" for f in out):
        out = [f for f in out if f.id != "host_bound"]
    if len(data.gpu_all) == 0:
        out.append(
            Finding(
                "no_gpu_activity",
                "info",
                data.rank,
                "The trace has no GPU activity, so only the CPU-side step table is available.",
                {"events": len(data.table)},
            )
        )
    return out


def straggler_finding(straggler: Straggler | None) -> Finding | None:
    """The rank the others wait for (distributed.py decides whether there is one), with its own cause."""
    if straggler is None:
        return None
    cause = straggler.cause
    why = ""
    if cause is not None:
        what = {
            "data_loader": "data loading",
            "op": f"`{cause.name}`",
        }.get(cause.phase, cause.phase)
        why = (
            f": its {what} takes {cause.rank_ms_per_step:.1f} ms per step against "
            f"{cause.others_ms_per_step:.1f} ms on the other ranks"
        )
        if cause.phase == "outside_regions":
            why = (
                f": its steps less the waiting take {cause.rank_ms_per_step:.1f} ms against "
                f"{cause.others_ms_per_step:.1f} ms on the other ranks, and no annotated region or op accounts "
                "for the difference (Python code, sleeps, I/O)"
            )
    action = {
        "data_loader": "give its DataLoader more workers or faster storage",
        "forward": "balance the work of the forward pass (uneven shards, sequence lengths or experts)",
        "backward": "balance the work of the backward pass",
        "optimizer": "balance the optimizer's work (sharded state, uneven parameter groups)",
    }.get(cause.phase if cause else "", "find what that rank does differently (host, data, work)")
    return Finding(
        "straggler",
        "high" if straggler.delay_pct >= STRAGGLER_HIGH_PCT else "medium",
        straggler.rank,
        f"Rank {straggler.rank} arrives last at the collectives and holds the other ranks back "
        f"{straggler.delay_ms_per_step:.1f} ms per step ({_p(straggler.delay_pct)} of the step){why}; {action}.",
        {
            "delay_ms_per_step": straggler.delay_ms_per_step,
            "delay_pct": straggler.delay_pct,
            "last_in_steps": straggler.last_in_steps,
            "steps": straggler.steps,
            "cause": cause.phase if cause else None,
            "cause_name": cause.name if cause else None,
            "cause_rank_ms_per_step": cause.rank_ms_per_step if cause else None,
            "cause_others_ms_per_step": cause.others_ms_per_step if cause else None,
        },
    )


# per rank: (steps in the window, mean step time in ms)
StepTimes = dict[int, tuple[int, float]]


def comm_findings(
    instances: dict[int, Instances], wait_ns: dict[int, np.ndarray], steps: StepTimes
) -> list[Finding]:
    """Findings on collectives: CPU-backend communication that takes a large share of the step
    (`comm_bound`; GPU communication is judged per rank from the kernels) and `collective_slow`."""
    out: list[Finding] = []
    for rank, inst in sorted(instances.items()):
        n, step = steps.get(rank, (0, 0.0))
        if inst.time_source != "cpu" or not len(inst) or not n or step <= 0:
            continue
        waits = np.clip(wait_ns[rank], 0, None)
        transfer_ms = (int((inst.end - inst.start).sum()) - int(waits.sum())) / 1e6 / n
        share = pct(transfer_ms, step)
        if share is not None and share >= COMM_CPU_MIN_PCT:
            out.append(
                Finding(
                    "comm_bound",
                    "high" if share >= COMM_EXPOSED_HIGH_PCT else "medium",
                    rank,
                    f"Collectives on the CPU backend take {transfer_ms:.1f} ms per step ({_p(share)} of the step) "
                    "besides waiting for peers; send fewer or larger messages (gradient bucketing, "
                    "no_sync over accumulation steps) or use a GPU backend.",
                    {
                        "transfer_ms_per_step": round(transfer_ms, 3),
                        "step_ms": round(step, 3),
                        "pct_of_step": share,
                    },
                )
            )
    out.extend(_collective_slow(instances, wait_ns, steps))
    return out


def _collective_slow(
    instances: dict[int, Instances], wait_ns: dict[int, np.ndarray], steps: StepTimes
) -> list[Finding]:
    """Instances whose bandwidth is far below the reference of the same kind and size across the run."""
    samples: dict[tuple[str, int, int], list[tuple[int, int, float, int]]] = {}
    for rank, inst in instances.items():
        if inst.time_source not in ("device", "cpu"):
            continue
        waits = np.clip(wait_ns[rank], 0, None)
        for i in range(len(inst)):
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
    lost: dict[tuple[int, str], list[tuple[float, float, float, int]]] = {}
    for (kind, _, _), rows in samples.items():
        if len(rows) < COLLECTIVE_SLOW_MIN_INSTANCES:
            continue
        reference = quantile([bw for _, _, bw, _ in rows], 0.75)
        for rank, _, bw, transfer in rows:
            if bw * COLLECTIVE_SLOW_FACTOR <= reference:
                lost.setdefault((rank, kind), []).append(
                    (transfer * (1 - bw / reference), bw, reference, transfer)
                )
    out = []
    for (rank, kind), slow in sorted(lost.items()):
        n, step = steps.get(rank, (0, 0.0))
        if not n or step <= 0:
            continue
        lost_ms = sum(x[0] for x in slow) / 1e6 / n
        share = pct(lost_ms, step)
        if share is None or share < COLLECTIVE_SLOW_MIN_PCT:
            continue
        worst = min(slow, key=lambda x: x[1] / x[2])
        out.append(
            Finding(
                "collective_slow",
                "high" if share >= COLLECTIVE_SLOW_HIGH_PCT else "medium",
                rank,
                f"{len(slow)} {kind} collectives on rank {rank} move data at {worst[1]:.3g} GB/s where the same "
                f"kind and size reach {worst[2]:.3g} GB/s elsewhere in the run ({worst[2] / worst[1]:.0f}x slower), "
                f"costing {lost_ms:.1f} ms per step; check that rank's links, NIC and NCCL settings "
                "(NCCL_DEBUG=INFO, NCCL_IB_HCA, the topology).",
                {
                    "kind": kind,
                    "slow_instances": len(slow),
                    "slowest_gbps": round(worst[1], 4),
                    "reference_gbps": round(worst[2], 4),
                    "lost_ms_per_step": round(lost_ms, 3),
                    "pct_of_step": share,
                },
            )
        )
    return out


def _p(value: float | None) -> str:
    """A percentage for a message: one decimal, '<0.1%' for tiny non-zero values."""
    if value is None:
        return "-"
    return "<0.1%" if 0 < value < 0.05 else f"{value:.1f}%"


def _window(data: RankData) -> int:
    return max(data.hi - data.lo, 0)


def _data_loader_stall(data: RankData, temporal: Temporal | None, *_: object) -> Finding | None:
    loader = region_union(data.table, DATALOADER_RE)
    if loader is None:
        return None
    loader = iv.clip(loader, data.lo, data.hi)
    loader_ns = iv.length(loader)
    loader_pct = pct(loader_ns, _window(data))
    if loader_pct is None or loader_pct < DATALOADER_MIN_PCT:
        return None
    busy = iv.merge(data.gpu_all.start, data.gpu_all.end)
    idle_ns = loader_ns - iv.length(iv.intersect(loader, busy))
    idle_pct = pct(idle_ns, loader_ns)
    has_gpu = len(data.gpu_all) > 0
    if has_gpu and (idle_pct is None or idle_pct < DATALOADER_GPU_IDLE_MIN_PCT):
        return None
    steps = max(len(data.steps), 1)
    where = "while the GPU sits idle" if has_gpu else "of the step"
    return Finding(
        "data_loader_stall",
        "high" if loader_pct >= DATALOADER_HIGH_PCT else "medium",
        data.rank,
        f"The training loop waits on the DataLoader for {_p(loader_pct)} of the step time {where}; "
        "use more loader workers, pin_memory and prefetching.",
        {
            "dataloader_us": ns_to_us(loader_ns),
            "dataloader_pct": loader_pct,
            "dataloader_us_per_step": ns_to_us(loader_ns / steps),
            "gpu_idle_during_loader_us": ns_to_us(idle_ns) if has_gpu else None,
            "gpu_idle_during_loader_pct": idle_pct if has_gpu else None,
            "window_us": ns_to_us(_window(data)),
        },
    )


def _launch_bound(
    data: RankData, temporal: Temporal | None, idle: Sequence[StreamIdle], *_: object
) -> Finding | None:
    if temporal is None or temporal.idle_pct is None or temporal.idle_pct < LAUNCH_BOUND_IDLE_MIN_PCT:
        return None
    idle_us = sum(s.idle_us for s in idle)
    host_us = sum(s.host_wait_us for s in idle)
    host_pct = pct(host_us, idle_us)
    if host_pct is None or host_pct < LAUNCH_BOUND_HOST_WAIT_MIN_PCT:
        return None
    kernels = data.gpu.kind != MEMORY
    dur = (data.gpu.end - data.gpu.start)[kernels]
    if len(dur) < LAUNCH_BOUND_MIN_KERNELS:
        return None
    short_pct = pct(int((dur < SHORT_KERNEL_NS).sum()), len(dur)) or 0.0
    evidence: Evidence = {
        "idle_pct": temporal.idle_pct,
        "host_wait_pct_of_idle": host_pct,
        "kernels": len(dur),
        "short_kernel_pct": short_pct,
        "median_kernel_us": ns_to_us(float(np.median(dur))),
        "kernels_per_step": round(len(dur) / max(len(data.steps), 1), 3),
    }
    if short_pct >= LAUNCH_BOUND_SHORT_MIN_PCT:
        return Finding(
            "launch_bound",
            "high",
            data.rank,
            f"The GPU is idle {_p(temporal.idle_pct)} of the time, mostly waiting for the CPU to launch many short "
            "kernels; fuse them (torch.compile) or capture the step with CUDA graphs.",
            evidence,
        )
    return Finding(
        "host_bound",
        "high" if temporal.idle_pct >= HOST_BOUND_HIGH_IDLE_PCT else "medium",
        data.rank,
        f"The GPU is idle {_p(temporal.idle_pct)} of the time waiting for the CPU to issue work; profile the CPU "
        "side of the step (Python overhead, data preparation, synchronisation).",
        evidence,
    )


def _comm_bound(
    data: RankData, temporal: Temporal | None, idle: object, overlap: CommOverlap | None
) -> Finding | None:
    if temporal is None or overlap is None or overlap.comm_us <= 0:
        return None
    exposed_pct = pct(overlap.exposed_us, temporal.span_us)
    if exposed_pct is None or exposed_pct < COMM_EXPOSED_MIN_PCT:
        return None
    return Finding(
        "comm_bound",
        "high" if exposed_pct >= COMM_EXPOSED_HIGH_PCT else "medium",
        data.rank,
        f"Communication not overlapped with computation takes {_p(exposed_pct)} of the GPU time "
        f"(overlap {_p(overlap.overlap_pct)}); overlap it (bucketed/async collectives, FSDP prefetch) or shrink it.",
        {
            "comm_us": overlap.comm_us,
            "overlap_pct": overlap.overlap_pct,
            "exposed_us": overlap.exposed_us,
            "exposed_pct_of_span": exposed_pct,
        },
    )


def _poor_overlap(
    data: RankData, temporal: Temporal | None, idle: object, overlap: CommOverlap | None
) -> Finding | None:
    """Communication kernels take a real share of the span but run mostly alone (comm_bound not yet reached)."""
    if temporal is None or overlap is None or overlap.comm_us <= 0 or overlap.overlap_pct is None:
        return None
    comm_pct = pct(overlap.comm_us, temporal.span_us)
    exposed_pct = pct(overlap.exposed_us, temporal.span_us)
    if (
        comm_pct is None
        or comm_pct < POOR_OVERLAP_MIN_COMM_PCT
        or overlap.overlap_pct >= POOR_OVERLAP_MAX_PCT
    ):
        return None
    if exposed_pct is not None and exposed_pct >= COMM_EXPOSED_MIN_PCT:
        return None  # comm_bound says it
    return Finding(
        "poor_overlap",
        "low",
        data.rank,
        f"Only {_p(overlap.overlap_pct)} of the communication ({overlap.comm_us / 1000:.1f} ms) "
        "runs under computation; issue collectives earlier (DDP bucket_cap_mb, FSDP forward/backward prefetch, "
        "async ops waited on later).",
        {
            "comm_us": overlap.comm_us,
            "comm_pct_of_span": comm_pct,
            "overlap_pct": overlap.overlap_pct,
            "exposed_us": overlap.exposed_us,
        },
    )


def _sync_points(data: RankData, *_: object) -> Finding | None:
    t = data.table
    ts, dur, ph = t.columns["ts"], t.columns["dur"], t.columns["ph"]
    in_window = (ph == _X) & (ts >= data.lo) & (ts < data.hi)
    # per name: 1 + index in _SYNC_KINDS of what it synchronizes, 0 for other names
    kinds = t.name_values(
        lambda n: 1 + _SYNC_KINDS.index(m.group(1)) if (m := SYNC_CALL_RE.match(n)) else 0,
        np.int8,
        key="sync_call",
    )
    sync_kind = kinds[t.columns["name"]] if len(t.names) else np.zeros(0, dtype=np.int8)
    sync_rows = np.flatnonzero(in_window & (sync_kind != 0))
    item_rows = _item_syncs(data, in_window)
    if len(sync_rows) == 0 and len(item_rows) == 0:
        return None
    rows = np.concatenate((sync_rows, item_rows))
    blocked = iv.length(iv.merge(ts[rows], ts[rows] + dur[rows]))
    blocked_pct = pct(blocked, _window(data)) or 0.0
    counts = {k: int((sync_kind[sync_rows] == 1 + i).sum()) for i, k in enumerate(_SYNC_KINDS)}
    severity = (
        "high" if blocked_pct >= SYNC_HIGH_PCT else "medium" if blocked_pct >= SYNC_MEDIUM_PCT else "low"
    )
    return Finding(
        "sync_points",
        severity,
        data.rank,
        f"The CPU blocks on the GPU {len(sync_rows) + len(item_rows)} times ({_p(blocked_pct)} of the step time); "
        "avoid .item()/.cpu()/explicit synchronize inside the step so the CPU can run ahead.",
        {
            "device_synchronize": counts["Device"] + counts["Ctx"],
            "stream_synchronize": counts["Stream"],
            "event_synchronize": counts["Event"],
            "item_syncs": len(item_rows),
            "blocked_us": ns_to_us(blocked),
            "blocked_pct": blocked_pct,
        },
    )


def _item_syncs(data: RankData, in_window: np.ndarray) -> np.ndarray:
    """`.item()`-style syncs: _local_scalar_dense (or aten::item) spans containing a memcpy runtime call."""
    t = data.table
    name, ts, dur, tid = t.columns["name"], t.columns["ts"], t.columns["dur"], t.columns["tid"]
    for op in ITEM_OP_NAMES:
        ops = np.flatnonzero(in_window & (name == (t.names.index(op) if op in t.names else -2)))
        if len(ops):
            break
    else:
        return np.zeros(0, dtype=np.int64)
    memcpy_names = t.names_matching(lambda n: MEMCPY_CALL_RE.match(n) is not None, key="memcpy_call")
    copies = np.flatnonzero((t.columns["ph"] == _X) & memcpy_names[name])
    if len(copies) == 0:
        return np.zeros(0, dtype=np.int64)
    copies = copies[np.argsort(ts[copies], kind="stable")]
    # the first memcpy call starting at or after each op's start must start before it ends, on its thread
    pos = np.searchsorted(ts[copies], ts[ops])
    has = pos < len(copies)
    c = copies[np.minimum(pos, len(copies) - 1)]
    hit = has & (ts[c] < ts[ops] + dur[ops]) & (tid[c] == tid[ops])
    return ops[hit]


def _pageable(data: RankData, temporal: Temporal | None, *_: object) -> Finding | None:
    g = data.gpu
    pageable = data.table.names_matching(lambda n: "Pageable" in n and "HtoD" in n, key="pageable_htod")
    sel = pageable[g.name] if len(g) else np.zeros(0, dtype=bool)
    if not sel.any():
        return None
    total = int((g.end[sel] - g.start[sel]).sum())
    nbytes = g.nbytes[sel]
    share = pct(total, int(g.end.max() - g.start.min())) or 0.0
    return Finding(
        "pageable_copies",
        "medium" if share >= PAGEABLE_MEDIUM_PCT else "low",
        data.rank,
        f"{int(sel.sum())} host-to-device copies come from pageable memory ({_p(share)} of the GPU span); "
        "use pin_memory=True and non_blocking=True so they run asynchronously.",
        {
            "copies": int(sel.sum()),
            "total_us": ns_to_us(total),
            "bytes": int(nbytes[nbytes >= 0].sum()),
            "pct_of_span": share,
        },
    )


def _tiny_kernels(data: RankData, *_: object) -> Finding | None:
    g = data.gpu
    kernels = g.kind != MEMORY
    dur = (g.end - g.start)[kernels]
    tiny = dur < TINY_KERNEL_NS
    n_tiny = int(tiny.sum())
    share = pct(n_tiny, len(dur))
    if n_tiny < TINY_KERNEL_MIN_COUNT or share is None or share < TINY_KERNEL_MIN_SHARE_PCT:
        return None
    names = g.name[kernels][tiny]
    ids, counts = np.unique(names, return_counts=True)
    top = int(ids[np.argmax(counts)])
    return Finding(
        "tiny_kernels",
        "medium" if share >= 80.0 else "low",
        data.rank,
        f"{_p(share)} of the kernels run for less than {TINY_KERNEL_NS / 1000:g} us; fusing them "
        "(torch.compile, fused optimizers) cuts launch overhead.",
        {
            "tiny_kernels": n_tiny,
            "kernels": len(dur),
            "tiny_pct": share,
            "tiny_total_us": ns_to_us(int(dur[tiny].sum())),
            "most_frequent": g.names[top],
            "most_frequent_count": int(counts.max()),
        },
    )
