"""Findings: rules that turn the numbers of one rank (or of all ranks) into advice, each priced in step time.

Every finding says what it costs the step: `cost_ms_per_step` is the time fixing it would save (an upper bound:
the GPU or the other ranks wait for exactly that long), measured in each step of the window and priced by the
median step; `pct_of_step` is the same as a share of the median step, and `evidence["arithmetic"]` shows how the
figure was reached. Severity follows the price (SEVERITY_PCT), but a finding that holds in at most half of the
steps is LOW and says in how many (_pricing.py). INFO findings carry no price. Findings about the collectives of
all ranks together are in _comm_findings.py; one finding per problem across ranks: _finding_groups.py.

GPU idle time is attributed once: the gaps in the union of GPU activity inside the window are split into the
time after a host synchronisation (`sync_points`), the data loader's time (`data_loader_stall`), the rest of the
waiting on the host (`host_bound` / `launch_bound`) and the launch latency between queued tiny kernels
(`tiny_kernels`). Every threshold is a named constant below and documented in docs/analysis.md ("Findings").
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

import numpy as np

from stepscope.analysis import intervals as iv
from stepscope.analysis.codes import unique_inverse
from stepscope.analysis.findings.pricing import (
    FINDING_MIN_NS_PER_STEP,
    FINDING_MIN_PCT,
    SEVERITY_PCT,
    Evidence,
    Finding,
    WindowSteps,
    price_of,
    priced,
    severity_of,
)
from stepscope.analysis.rank import host
from stepscope.analysis.rank.breakdown import Temporal
from stepscope.analysis.rank.kernels import COMMUNICATION, COMPUTATION, MEMORY, MISSING_TS
from stepscope.analysis.rank.overlap import CommOverlap
from stepscope.analysis.rank.prepare import RankData
from stepscope.analysis.rank.steps import DATALOADER_RE, ns_to_us, pct
from stepscope.analysis.rank.summary import op_tree
from stepscope.analysis.ranks.distributed import Straggler
from stepscope.analysis.read.table import TraceTable
from stepscope.analysis.stats import median
from stepscope.units import fmt_ms, fmt_ns, fmt_pct

__all__ = [
    "FINDING_MIN_NS_PER_STEP",
    "FINDING_MIN_PCT",
    "SEVERITY_PCT",
    "Evidence",
    "Finding",
    "rank_by_cost",
    "rank_findings",
    "severity_of",
    "straggler_finding",
]

# data_loader_stall: the step waits on the loader (GPU idle, or no GPU) for at least this share of the step.
DATALOADER_MIN_PCT = 5.0
# sync_points: a synchronisation costs the GPU idle time that follows it (the CPU could not queue work ahead);
# the GPU counts as drained by the sync when it goes idle within SYNC_SLACK_NS after the call returns.
SYNC_SLACK_NS = 20_000
# launch_bound rather than host_bound: at least this share of the kernels (and LAUNCH_BOUND_MIN_KERNELS of
# them per step) run shorter than SHORT_KERNEL_NS, so launching them costs more than running them.
LAUNCH_BOUND_SHORT_MIN_PCT = 50.0
LAUNCH_BOUND_MIN_KERNELS = 10
SHORT_KERNEL_NS = 10_000
# tiny_kernels: at least TINY_KERNEL_MIN_COUNT kernels shorter than TINY_KERNEL_NS, this share of all kernels;
# priced by the queued gaps in front of them (launch latency the GPU spends idle between them).
TINY_KERNEL_NS = 5_000
TINY_KERNEL_MIN_COUNT = 100
TINY_KERNEL_MIN_SHARE_PCT = 50.0
# comm_bound: communication not hidden by computation, priced by that exposed time.
COMM_EXPOSED_MIN_PCT = 10.0
# poor_overlap: communication kernels cover at least this share of the GPU span and overlap less than ...
POOR_OVERLAP_MIN_COMM_PCT = 5.0
POOR_OVERLAP_MAX_PCT = 30.0
# CPU-only runs. python_overhead: the step runs no torch op for at least this share of it.
PYTHON_OVERHEAD_MIN_PCT = 20.0
# optimizer_bound: the optimizer takes at least this share of the step.
OPTIMIZER_MIN_PCT = 25.0
# many_small_ops: at least this many top-level ops per step shorter than SMALL_OP_NS, taking this share of it.
SMALL_OPS_MIN_PER_STEP = 500
SMALL_OP_NS = 20_000
SMALL_OPS_MIN_PCT = 20.0

SYNC_CALL_RE = re.compile(r"^(?:cuda|hip|cu)(Device|Stream|Event|Ctx)Synchroni[sz]e")
_SYNC_KINDS = ("Device", "Stream", "Event", "Ctx")  # SYNC_CALL_RE's group 1
MEMCPY_CALL_RE = re.compile(r"^(?:cuda|hip|cu)Memcpy")
ITEM_OP_NAMES = ("aten::_local_scalar_dense", "aten::item")

_X = ord("X")


# Records of arrays: compared and printed by identity (a field-wise == of arrays raises, and their repr
# would print the arrays); generating __eq__ and __repr__ cost ~0.15 ms of every start.
@dataclass(eq=False, repr=False)
class _Gaps:
    """The GPU idle gaps of a rank's window: all of them, and those where the next activity was launched only
    after the GPU went idle (the GPU waited on the host)."""

    all: iv.Intervals
    host: iv.Intervals
    queued_before: (
        np.ndarray
    )  # per gap of `all`: index (in the window's GPU events) of the activity ending it


def _members(values: np.ndarray, ascending: np.ndarray) -> np.ndarray:
    """np.isin(values, ascending) for an ascending second array, by binary search: np.isin of two long arrays
    of a wide range sorts them through np.unique, whose first call imports numpy.ma (~16 ms a process)."""
    if len(ascending) == 0:
        return np.zeros(len(values), dtype=bool)
    at = np.minimum(np.searchsorted(ascending, values), len(ascending) - 1)
    return np.asarray(ascending[at] == values)


def _idle_gaps(data: RankData) -> _Gaps | None:
    """Gaps in the union of GPU activity inside [lo, hi), the stretch before the first activity and after the
    last one included (the step's GPU time starts with the step)."""
    g = data.gpu
    if len(g) == 0 or data.hi <= data.lo:
        return None
    order = np.argsort(g.start, kind="stable")
    starts = g.start[order]
    busy_s, busy_e = iv.clip(iv.merge(g.start, g.end), data.lo, data.hi, owned=True)
    gap_s = np.r_[data.lo, busy_e].astype(np.int64)
    gap_e = np.r_[busy_s, data.hi].astype(np.int64)
    # the activity that ends each gap (the last gap, up to the window's end, has none)
    nxt = np.searchsorted(starts, gap_e[:-1], side="left")
    nxt = np.minimum(nxt, len(order) - 1)
    launch = g.launch[order][nxt]
    host = np.r_[(launch != MISSING_TS) & (launch > gap_s[:-1]), True]
    keep = gap_e > gap_s
    ending = np.r_[order[nxt], -1]
    return _Gaps((gap_s[keep], gap_e[keep]), (gap_s[keep & host], gap_e[keep & host]), ending[keep])


def rank_findings(
    data: RankData,
    temporal: Temporal | None,
    overlap: CommOverlap | None,
    comm: iv.Intervals | None = None,
) -> list[Finding]:
    """Every rule that applies to one rank. `comm`: the rank's time in communication, a union
    (collectives.communication_intervals)."""
    out: list[Finding] = []
    gaps = _idle_gaps(data)
    loader = host.phase_unions(data.table, data.lo, data.hi)["data_loader"]
    syncs, sync_idle = _sync_points(data, gaps)
    claimed = _union(loader, sync_idle)
    comm_bound = _comm_bound(data, temporal, overlap)
    for found in (
        _data_loader_stall(data, gaps, loader),
        syncs,
        _host_waits(data, gaps, claimed),
        _tiny_kernels(data, gaps),
        comm_bound,
        _poor_overlap(data, temporal, overlap, comm_bound),
        _pageable(data),
    ):
        if found is not None:
            out.append(found)
    if len(data.gpu_all) == 0:
        out.extend(_cpu_only(data, loader, comm))
    return out


def _union(a: iv.Intervals, b: iv.Intervals) -> iv.Intervals:
    return iv.merge(np.r_[a[0], b[0]], np.r_[a[1], b[1]])


def _ms(ns: float) -> float:
    return round(ns / 1e6, 3)


def _data_loader_stall(data: RankData, gaps: _Gaps | None, loader: iv.Intervals) -> Finding | None:
    if iv.length(loader) == 0:
        return None
    has_gpu = gaps is not None
    stalled = iv.intersect(loader, gaps.all) if gaps is not None else loader
    name = _loader_name(data)
    where = "while the GPU sits idle" if has_gpu else "(no GPU activity: the step waits)"
    price = price_of(data, stalled, min_pct=DATALOADER_MIN_PCT)
    return priced(
        "data_loader_stall",
        data.rank,
        price,
        "data loader time" + (" with the GPU idle" if has_gpu else ""),
        f"The training loop waits {fmt_ms(price.ms)} per step ({_p(price.pct)} of the step) on the DataLoader "
        f"(`{name}`) {where}",
        "raise DataLoader num_workers (with pin_memory=True, persistent_workers=True) or make __getitem__ cheaper",
        {
            "dataloader_ms_per_step": price.median_ms(loader),
            "gpu_idle_during_loader_ms_per_step": price.median_ms(stalled) if has_gpu else None,
            "loader": name,
        },
    )


def _loader_name(data: RankData) -> str:
    t = data.table
    names = t.names_matching(lambda n: DATALOADER_RE.search(n) is not None, key="loader_names")
    # The first of the matching names (by code) that a row uses: a min, not np.unique, which imports numpy.ma
    # (~16 ms, once per process) on its first call without return_* arguments.
    if not len(t.names):
        return "DataLoader"
    used = t.columns["name"][names[t.columns["name"]]]
    return t.names[int(used.min())] if len(used) else "DataLoader"


def _sync_points(data: RankData, gaps: _Gaps | None) -> tuple[Finding | None, iv.Intervals]:
    """Host synchronisations (explicit calls and .item()-style copies) priced by the GPU idle time after each:
    a sync while other GPU work is still running costs nothing."""
    empty = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    if gaps is None:
        return None, empty
    t = data.table
    ts, dur, ph = t.columns["ts"], t.columns["dur"], t.columns["ph"]
    in_window = (ph == _X) & (ts >= data.lo) & (ts < data.hi)
    kinds = t.name_values(
        lambda n: 1 + _SYNC_KINDS.index(m.group(1)) if (m := SYNC_CALL_RE.match(n)) else 0,
        np.int8,
        key="sync_call",
    )
    sync_kind = kinds[t.columns["name"]] if len(t.names) else np.zeros(0, dtype=np.int8)
    sync_rows = np.flatnonzero(in_window & (sync_kind != 0))
    item_rows = _item_syncs(data, in_window)
    rows = np.concatenate((sync_rows, item_rows))
    if len(rows) == 0:
        return None, empty
    ends = ts[rows] + dur[rows]
    gs, ge = gaps.all
    # the gap each sync drained the GPU into: the first gap ending after the call returned, if it starts
    # no later than SYNC_SLACK_NS after it
    k = np.searchsorted(ge, ends, side="right")
    valid = k < len(gs)
    kk = np.minimum(k, max(len(gs) - 1, 0))
    drained = valid & (gs[kk] <= ends + SYNC_SLACK_NS) if len(gs) else np.zeros(len(rows), dtype=bool)
    idle_s = np.maximum(gs[kk], ends)[drained] if len(gs) else ends[:0]
    idle_e = ge[kk][drained] if len(gs) else ends[:0]
    idle = iv.merge(idle_s, idle_e)
    costly = rows[drained & (np.maximum(ge[kk], 0) > np.maximum(gs[kk], ends))] if len(gs) else rows[:0]
    counts = {k_: int((sync_kind[sync_rows] == 1 + i).sum()) for i, k_ in enumerate(_SYNC_KINDS)}
    where = _enclosing_op(t, costly)
    price = price_of(data, idle)
    named = f", most of it after `{where[0]}` ({where[1]} of them)" if where else ""
    finding = priced(
        "sync_points",
        data.rank,
        price,
        "GPU idle time after the syncs that drained it",
        f"{len(costly)} of the {len(rows)} host synchronisations leave the GPU idle afterwards, "
        f"{fmt_ms(price.ms)} per step ({_p(price.pct)} of the step){named}",
        "move .item()/.cpu()/torch.cuda.synchronize() out of the step or after the next launches, so the CPU "
        "queues work ahead of the GPU",
        {
            "syncs": len(rows),
            "syncs_leaving_gpu_idle": len(costly),
            "device_synchronize": counts["Device"] + counts["Ctx"],
            "stream_synchronize": counts["Stream"],
            "event_synchronize": counts["Event"],
            "item_syncs": len(item_rows),
            "blocked_ms_per_step": price.median_ms(iv.merge(ts[rows], ends)),
            "op": where[0] if where else None,
        },
    )
    return finding, idle


def _enclosing_op(table: TraceTable, rows: np.ndarray) -> tuple[str, int] | None:
    """The most common innermost cpu_op around the given runtime calls (or the rows themselves when they are
    ops): (name, how many of the rows)."""
    if len(rows) == 0:
        return None
    rows = rows[:10_000]
    cat, ts, dur, tid = (table.columns[c] for c in ("cat", "ts", "dur", "tid"))
    is_op = cat[rows] == table.cat_id("cpu_op")
    around = np.where(is_op, rows, -1)
    queries = np.flatnonzero(~is_op)
    tree = op_tree(table, ("cpu_op",))
    ops, parent = tree.rows, tree.parent
    if len(queries) and len(ops):
        # ops by thread, start, longest first; each query starts from the last op that starts no later than
        # it on its thread and climbs that op's ancestors until one ends no earlier than the query
        start, end = ts[ops], ts[ops] + dur[ops]
        pid = table.columns["pid"]
        bounds = np.append(np.flatnonzero(tree.new_thread(table)), len(ops)).tolist()
        q = rows[queries]
        q_start, q_end, q_pid, q_tid = ts[q], ts[q] + dur[q], pid[q], tid[q]
        cand = np.full(len(q), -1, dtype=np.int64)
        for lo, hi in itertools.pairwise(bounds):
            mine = (q_pid == pid[ops[lo]]) & (q_tid == tid[ops[lo]])
            if mine.any():
                at = np.searchsorted(start[lo:hi], q_start[mine], "right") - 1
                cand[mine] = np.where(at >= 0, at + lo, -1)
        while True:
            climb = np.flatnonzero(cand >= 0)
            climb = climb[end[cand[climb]] < q_end[climb]]
            if not len(climb):
                break
            cand[climb] = parent[cand[climb]]
        around[queries] = np.where(cand >= 0, ops[np.maximum(cand, 0)], q)
    elif len(queries):
        around[queries] = rows[queries]
    codes, inverse = unique_inverse(table.columns["name"][around])
    counts = np.bincount(inverse)
    found: dict[str, int] = {}
    for code, n in zip(codes.tolist(), counts.tolist(), strict=True):
        name = table.names[code]
        found[name] = found.get(name, 0) + n
    name, n = max(found.items(), key=lambda kv: (kv[1], kv[0]))
    return name, n


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


_PHASE_ACTIONS = {
    "optimizer": "use a fused optimizer (fused=True or foreach=True) or fewer, larger parameter tensors",
    "forward": "cut the CPU work per kernel in the forward pass (torch.compile, CUDA graphs, larger batches)",
    "backward": "cut the CPU work of the backward pass (torch.compile, CUDA graphs, fewer hooks)",
    "other": "move the Python work between the phases (logging, metrics, .item(), checkpoints) out of the "
    "step or overlap it with GPU work",
}


def _host_waits(data: RankData, gaps: _Gaps | None, claimed: iv.Intervals) -> Finding | None:
    """launch_bound / host_bound: the GPU waits for the host to issue work (loader and post-sync idle left to
    their own findings), with the phase and ops the host is busy with meanwhile."""
    if gaps is None:
        return None
    waits = iv.subtract(gaps.host, claimed)
    cost = iv.length(waits)
    price = price_of(data, waits)
    if price.severity is None:
        return None
    g = data.gpu
    kernels = g.kind != MEMORY
    dur = (g.end - g.start)[kernels]
    n_kernels = len(dur)
    short_pct = pct(int((dur < SHORT_KERNEL_NS).sum()), n_kernels) or 0.0
    per_step = n_kernels / price.steps
    n_waits = len(waits[0])
    evidence: Evidence = {
        "gpu_waits_per_step": round(n_waits / price.steps, 1),
        "mean_wait_us": ns_to_us(cost / n_waits) if n_waits else None,
        "kernels_per_step": round(per_step, 1),
        "mean_kernel_us": ns_to_us(float(dur.mean())) if n_kernels else None,
        "short_kernel_pct": short_pct,
    }
    what = "GPU idle waiting for the host to launch work (loader and post-sync idle excluded)"
    if short_pct >= LAUNCH_BOUND_SHORT_MIN_PCT and per_step >= LAUNCH_BOUND_MIN_KERNELS:
        return priced(
            "launch_bound",
            data.rank,
            price,
            what,
            f"The GPU waits {fmt_ms(price.ms)} per step ({_p(price.pct)} of the step) for the CPU to launch "
            f"{per_step:.0f} kernels per step, {_p(short_pct)} of them shorter than "
            f"{SHORT_KERNEL_NS / 1000:g} us; it goes idle {n_waits / price.steps:.0f} times per step, "
            f"{fmt_ns(cost / n_waits if n_waits else 0)} each on average",
            "fuse the small kernels (torch.compile) or capture the step with CUDA graphs",
            evidence,
        )
    unions = host.phase_unions(data.table, data.lo, data.hi)
    phases = host.phase_times(unions, waits)
    ranked = sorted(((n, p) for p, n in phases.items() if n and p != "data_loader"), reverse=True)
    parts = []
    helds = []
    top_op: host.OpTime | None = None
    for i, (phase_ns, phase) in enumerate(ranked[:2]):
        if i and phase_ns < cost / 10:
            break
        stretch = iv.intersect(waits, unions[phase]) if phase in unions else iv.subtract(waits, _all(unions))
        ops = host.ops_during(data.table, stretch, top=1)
        decisive = ops and ops[0].ns >= phase_ns / 4
        held = (
            f"mostly `{ops[0].name}`, {fmt_ns(ops[0].mean_call_ns)} per call"
            if decisive
            else "no single op accounts for it"
        )
        median_ms = price.median_ms(stretch)
        parts.append(f"in {host.PHASE_LABELS[phase]} for {fmt_ms(median_ms)} of it ({held})")
        helds.append(held)
        if i == 0 and decisive:
            top_op = ops[0]
        evidence[f"{phase}_ms_per_step"] = median_ms
        if decisive:
            evidence[f"{phase}_top_op"] = ops[0].name
            evidence[f"{phase}_top_op_ms_per_call"] = _ms(ops[0].mean_call_ns)
    phase = ranked[0][1] if ranked else "other"
    evidence["phase"] = phase
    annotated = any(len(u[0]) for p, u in unions.items() if p != "data_loader")
    action = _PHASE_ACTIONS.get(phase, _PHASE_ACTIONS["other"])
    during = "during those waits the CPU is " + " and ".join(parts)
    if not annotated:
        # no forward / backward / optimizer regions (inference, or a loop without annotations)
        during = "the trace annotates no phase; during those waits the CPU runs " + (
            helds[0].replace("no single op accounts for it", "no single op that accounts for them")
            if helds
            else "no recorded op"
        )
        action = (
            "cut the CPU work between kernel launches (torch.compile, CUDA graphs); find it with "
            "with_stack=True or py-spy"
        )
    if top_op is not None and phase in ("forward", "backward", "other"):
        action = f"make `{top_op.name}` cheaper on the CPU or move it off the step's path"
    return priced(
        "host_bound",
        data.rank,
        price,
        what,
        f"The GPU waits {fmt_ms(price.ms)} per step ({_p(price.pct)} of the step) for the CPU; {during}",
        action,
        evidence,
    )


def _all(unions: dict[str, iv.Intervals]) -> iv.Intervals:
    starts = np.concatenate([u[0] for u in unions.values()]) if unions else np.zeros(0, dtype=np.int64)
    ends = np.concatenate([u[1] for u in unions.values()]) if unions else np.zeros(0, dtype=np.int64)
    return iv.merge(starts, ends)


def _tiny_kernels(data: RankData, gaps: _Gaps | None) -> Finding | None:
    """Many tiny kernels, priced by the queued gaps (launch latency) in front of them."""
    if gaps is None:
        return None
    g = data.gpu
    kernels = g.kind != MEMORY
    dur = g.end - g.start
    tiny = kernels & (dur < TINY_KERNEL_NS)
    n_tiny = int(tiny.sum())
    share = pct(n_tiny, int(kernels.sum()))
    if n_tiny < TINY_KERNEL_MIN_COUNT or share is None or share < TINY_KERNEL_MIN_SHARE_PCT:
        return None
    gs, ge = gaps.all
    ending = gaps.queued_before
    host = _members(gs, gaps.host[0])
    before_tiny = (ending >= 0) & ~host & tiny[np.maximum(ending, 0)]
    ids, counts = np.unique(g.name[tiny], return_counts=True)
    top = int(ids[np.argmax(counts)])
    price = price_of(data, (gs[before_tiny], ge[before_tiny]))
    return priced(
        "tiny_kernels",
        data.rank,
        price,
        "GPU idle between queued kernels shorter than 5 us",
        f"{_p(share)} of the kernels ({n_tiny / price.steps:.0f} per step) run under "
        f"{TINY_KERNEL_NS / 1000:g} us, most often `{g.names[top]}` ({int(counts.max())}x); the GPU idles "
        f"{fmt_ms(price.ms)} per step between them",
        "fuse them (torch.compile, fused or foreach optimizers, larger tensors)",
        {
            "tiny_kernels": n_tiny,
            "kernels": int(kernels.sum()),
            "tiny_pct": share,
            "tiny_total_ms_per_step": price.median_ms(iv.merge(g.start[tiny], g.end[tiny])),
            "most_frequent": g.names[top],
            "most_frequent_count": int(counts.max()),
        },
    )


def _exposed_comm(data: RankData) -> tuple[iv.Intervals, iv.Intervals]:
    """The communication kernels' time (a union) and the part of it no computation kernel runs under (as
    overlap.comm_compute_overlap measures it, but as intervals: the price is taken step by step)."""
    comm, comp = data.gpu.of_kind(COMMUNICATION), data.gpu.of_kind(COMPUTATION)
    comm_u = iv.merge(comm.start, comm.end)
    return comm_u, iv.subtract(comm_u, iv.merge(comp.start, comp.end))


def _comm_bound(data: RankData, temporal: Temporal | None, overlap: CommOverlap | None) -> Finding | None:
    if temporal is None or overlap is None or overlap.comm_us <= 0:
        return None
    comm, exposed = _exposed_comm(data)
    price = price_of(data, exposed, min_pct=COMM_EXPOSED_MIN_PCT)
    return priced(
        "comm_bound",
        data.rank,
        price,
        "communication kernel time not overlapped by computation",
        f"Communication not overlapped with computation takes {fmt_ms(price.ms)} per step "
        f"({_p(price.pct)} of the step); only {_p(overlap.overlap_pct)} of the "
        f"{fmt_ms(price.median_ms(comm))} of communication per step runs under computation",
        "overlap it (DDP bucket_cap_mb, FSDP prefetch, async collectives waited on later) or send less",
        {
            "comm_ms": _ms(overlap.comm_us * 1000),
            "overlap_pct": overlap.overlap_pct,
            "exposed_ms": _ms(overlap.exposed_us * 1000),
        },
    )


def _poor_overlap(
    data: RankData, temporal: Temporal | None, overlap: CommOverlap | None, comm_bound: Finding | None
) -> Finding | None:
    """Communication kernels take a real share of the span but run mostly alone (comm_bound not raised)."""
    if (
        comm_bound is not None
        or temporal is None
        or overlap is None
        or overlap.comm_us <= 0
        or overlap.overlap_pct is None
    ):
        return None
    comm_pct = pct(overlap.comm_us, temporal.span_us)
    if (
        comm_pct is None
        or comm_pct < POOR_OVERLAP_MIN_COMM_PCT
        or overlap.overlap_pct >= POOR_OVERLAP_MAX_PCT
    ):
        return None
    price = price_of(data, _exposed_comm(data)[1])
    return priced(
        "poor_overlap",
        data.rank,
        price,
        "communication kernel time not overlapped by computation",
        f"Only {_p(overlap.overlap_pct)} of the communication ({fmt_ms(overlap.comm_us / 1000)}) runs under "
        f"computation; the rest costs {fmt_ms(price.ms)} per step",
        "issue collectives earlier (DDP bucket_cap_mb, FSDP forward/backward prefetch, async ops waited on later)",
        {
            "comm_ms": _ms(overlap.comm_us * 1000),
            "comm_pct_of_span": comm_pct,
            "overlap_pct": overlap.overlap_pct,
        },
    )


def _pageable(data: RankData) -> Finding | None:
    """Host-to-device copies from pageable memory: synchronous for the host, priced by their GPU time."""
    g = data.gpu
    if len(g) == 0:
        return None
    pageable = data.table.names_matching(lambda n: "Pageable" in n and "HtoD" in n, key="pageable_htod")
    sel = pageable[g.name]
    if not sel.any():
        return None
    nbytes = g.nbytes[sel]
    price = price_of(data, iv.merge(g.start[sel], g.end[sel]))
    return priced(
        "pageable_copies",
        data.rank,
        price,
        "time of host-to-device copies from pageable memory",
        f"{int(sel.sum()) / price.steps:.0f} host-to-device copies per step come from pageable memory and "
        f"take {fmt_ms(price.ms)} per step",
        "use pin_memory=True in the DataLoader and .to(device, non_blocking=True)",
        {"copies": int(sel.sum()), "bytes": int(nbytes[nbytes >= 0].sum())},
    )


def _cpu_only(data: RankData, loader: iv.Intervals, comm: iv.Intervals | None) -> list[Finding]:
    """Runs without GPU activity: where the step goes (info), and the CPU-side problems that hold it."""
    steps = WindowSteps.of(data)
    n = len(steps)
    if data.hi <= data.lo:
        return []
    phases_iv = host.phase_unions(data.table, data.lo, data.hi)
    out = [_step_breakdown(data, steps, phases_iv, comm)]
    count, small, small_ops = host.small_top_level_ops(data.table, data.lo, data.hi, SMALL_OP_NS)
    many_small = small / n >= SMALL_OPS_MIN_PER_STEP
    # the Python issuing a run of small ops one after another is that run's own cost (many_small_ops)
    untraced = host.untraced_time(data.table, data.lo, data.hi)
    if many_small:
        untraced = iv.subtract(untraced, small_ops)
    price = price_of(data, untraced, min_pct=PYTHON_OVERHEAD_MIN_PCT)
    regions = host.regions_during(data.table, untraced)
    untraced_ns = iv.length(untraced)
    region = regions[0][0] if regions and regions[0][1] >= untraced_ns / 2 else None
    if region is not None:
        inside = f", most of it ({_p(100 * regions[0][1] / untraced_ns)}) inside `{region}`"
    else:
        inside = ", most of it outside any annotated region"
    found = priced(
        "python_overhead",
        data.rank,
        price,
        "step time in which no torch op runs",
        f"{fmt_ms(price.ms)} per step ({_p(price.pct)} of the step) run no torch op at all (Python code, "
        f"sleeps, I/O, logging){inside}",
        "find that Python work with a sampling profiler (py-spy) and move it out of the step or vectorise it",
        {"region": region},
    )
    if found is not None:
        out.append(found)
    optimizer = phases_iv["optimizer"]
    opt_ns = iv.length(optimizer)
    price = price_of(data, optimizer, min_pct=OPTIMIZER_MIN_PCT)
    ops = host.ops_during(data.table, optimizer) if opt_ns else []
    op_text = (
        f"; its top op is `{ops[0].name}` ({_p(100 * ops[0].ns / opt_ns)} of its time, "
        f"{ops[0].calls / n:.0f} calls per step)"
        if ops
        else ""
    )
    found = priced(
        "optimizer_bound",
        data.rank,
        price,
        "time in the optimizer",
        f"The optimizer takes {fmt_ms(price.ms)} per step ({_p(price.pct)} of the step){op_text}",
        f"make `{ops[0].name}` cheaper or run it less often"
        if ops and ops[0].ns >= opt_ns / 2 and "foreach" not in ops[0].name
        else _PHASE_ACTIONS["optimizer"],
        {
            "top_op": ops[0].name if ops else None,
            "top_op_calls_per_step": ops[0].calls / n if ops else None,
        },
    )
    if found is not None:
        out.append(found)
    if many_small:
        price = price_of(data, small_ops, min_pct=SMALL_OPS_MIN_PCT)
        found = priced(
            "many_small_ops",
            data.rank,
            price,
            f"time of runs of top-level ops shorter than {SMALL_OP_NS / 1000:g} us (gaps under it included)",
            f"The step runs {small / n:.0f} top-level ops per step shorter than {SMALL_OP_NS / 1000:g} us, "
            f"one after another: {fmt_ms(price.ms)} per step with the Python between them, mostly overhead",
            "batch the work into fewer, larger tensor ops (vectorise loops, torch.compile, foreach ops)",
            {
                "top_level_ops_per_step": round(count / n, 1),
                "small_ops_per_step": round(small / n, 1),
            },
        )
        if found is not None:
            out.append(found)
    return out


def _step_breakdown(
    data: RankData, steps: WindowSteps, phases_iv: dict[str, iv.Intervals], comm: iv.Intervals | None
) -> Finding:
    """Where the median step goes, phase by phase, then the communication outside the phases (each figure the
    median over the window's steps, so they need not add up to the median step); a phase the trace never
    annotates is null, not 0."""
    annotated = host.annotated_phases(data.table)
    per_step = {p: steps.covered(u) for p, u in phases_iv.items()}
    if comm is not None:
        outside = iv.subtract(iv.clip(comm, data.lo, data.hi), _all(phases_iv))
        per_step["communication"] = steps.covered(outside)
    per_step["other"] = np.maximum(steps.length - sum(per_step.values()), 0)
    step_ns = median(steps.length.tolist())
    medians = {p: median(v.tolist()) for p, v in per_step.items()}
    parts = ", ".join(
        f"{host.PHASE_LABELS[p]} {fmt_ns(ns)} ({100 * ns / step_ns:.0f}%)" for p, ns in medians.items() if ns
    )
    evidence: Evidence = {
        f"{p}_ms_per_step": _ms(ns) if p in ("other", "communication") or p in annotated else None
        for p, ns in medians.items()
    }
    evidence.update({"step_ms": _ms(step_ns), "steps": len(steps)})
    unannotated = [host.PHASE_LABELS[p] for p in host.PHASES if p not in annotated]
    unknown = ""
    if unannotated:
        which = (
            " and ".join((", ".join(unannotated[:-1]), unannotated[-1]))
            if len(unannotated) > 1
            else unannotated[0]
        )
        unknown = f" The trace does not annotate {which}: that time is in other code."
    return Finding(
        "step_breakdown",
        "info",
        data.rank,
        f"No GPU activity: the median step ({fmt_ns(step_ns)}) goes to {parts}.{unknown}",
        evidence,
        steps=len(steps),
    )


def rank_by_cost(findings: list[Finding]) -> list[Finding]:
    """Priced findings by time at stake (largest first), then info ones; ties by rank and id."""
    return sorted(
        findings,
        key=lambda f: (
            f.cost_ms_per_step is None,
            -(f.cost_ms_per_step or 0.0),
            f.rank if f.rank is not None else -1,
            f.id,
        ),
    )


def straggler_finding(straggler: Straggler | None) -> Finding | None:
    """The rank the others wait for (distributed.py decides whether there is one), with its own cause."""
    if straggler is None:
        return None
    cause = straggler.cause
    why = ""
    if cause is not None:
        what = {"data_loader": "data loading", "op": f"`{cause.name}`"}.get(cause.phase, cause.phase)
        why = (
            f": its {what} takes {fmt_ms(cause.rank_ms_per_step)} per step against "
            f"{fmt_ms(cause.others_ms_per_step)} on the other ranks"
        )
        if cause.phase == "outside_regions":
            why = (
                f": its steps less the waiting take {fmt_ms(cause.rank_ms_per_step)} against "
                f"{fmt_ms(cause.others_ms_per_step)} on the other ranks, and no annotated region or op accounts "
                "for the difference (Python code, sleeps, I/O)"
            )
    action = {
        "data_loader": "give its DataLoader more workers or faster storage",
        "forward": "balance the work of the forward pass (uneven shards, sequence lengths or experts)",
        "backward": "balance the work of the backward pass",
        "optimizer": "balance the optimizer's work (sharded state, uneven parameter groups)",
    }.get(cause.phase if cause else "", "find what that rank does differently (host, data, work)")
    share = straggler.delay_pct
    return Finding(
        "straggler",
        severity_of(share) or "low",
        straggler.rank,
        f"Rank {straggler.rank} arrives last at the collectives and holds the other ranks back "
        f"{fmt_ms(straggler.delay_ms_per_step)} per step ({_p(share)} of the step){why}; {action}.",
        {
            "last_in_steps": straggler.last_in_steps,
            "steps": straggler.steps,
            "cause": cause.phase if cause else None,
            "cause_name": cause.name if cause else None,
            "cause_rank_ms_per_step": cause.rank_ms_per_step if cause else None,
            "cause_others_ms_per_step": cause.others_ms_per_step if cause else None,
            "arithmetic": f"the other ranks wait for it {straggler.delay_ms_per_step:.3f} ms per step (each "
            "one's waits at the collectives it arrives last at, a union in time, averaged over those ranks and "
            f"{straggler.steps} matched steps); {share:.1f}% of their mean step",
        },
        cost_ms_per_step=round(straggler.delay_ms_per_step, 3),
        pct_of_step=round(share, 2),
        action=action,
    )


_p = fmt_pct
