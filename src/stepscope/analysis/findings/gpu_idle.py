"""Rules about the GPU's idle time on one rank, each gap attributed once: the time after a host
synchronisation (`sync_points`), the data loader's time (`data_loader_stall`), the rest of the waiting on the host
(`host_bound` / `launch_bound`), the launch latency between queued tiny kernels (`tiny_kernels`); and copies
from pageable memory (`pageable_copies`). Every threshold is a named constant, documented in docs/analysis.md."""

from __future__ import annotations

import itertools
import re

import msgspec
import numpy as np

from stepscope.analysis import intervals as iv
from stepscope.analysis.codes import unique_inverse
from stepscope.analysis.findings._common import (
    OUTSIDE_OPS_MIN_SHARE,
    PHASE_ACTIONS,
    all_of,
    code_name,
    fmt_p,
    ms,
    python_action,
)
from stepscope.analysis.findings.pricing import (
    Evidence,
    Finding,
    price_of,
    priced,
)
from stepscope.analysis.findings.rule import Rule
from stepscope.analysis.per_rank import host
from stepscope.analysis.per_rank.kernels import MEMORY, MISSING_TS
from stepscope.analysis.per_rank.prepare import RankData
from stepscope.analysis.per_rank.steps import DATALOADER_RE, ns_to_us, pct
from stepscope.analysis.per_rank.summary import op_tree
from stepscope.analysis.read.table import TraceTable
from stepscope.units import fmt_ms, fmt_ns

DATA_LOADER_STALL = Rule("data_loader_stall", "overview", "the DataLoader's time while the GPU is idle")
SYNC_POINTS = Rule("sync_points", "gpu", "the GPU's idle time after host synchronisations")
LAUNCH_BOUND = Rule("launch_bound", "gpu", "the GPU's idle time while the host launches short kernels")
HOST_BOUND = Rule("host_bound", "gpu", "the GPU's idle time while the host works on something else")
TINY_KERNELS = Rule("tiny_kernels", "gpu", "the launch gaps between queued tiny kernels")
PAGEABLE_COPIES = Rule("pageable_copies", "gpu", "the time of copies from pageable host memory")
RULES = (DATA_LOADER_STALL, SYNC_POINTS, LAUNCH_BOUND, HOST_BOUND, TINY_KERNELS, PAGEABLE_COPIES)

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


SYNC_CALL_RE = re.compile(r"^(?:cuda|hip|cu)(Device|Stream|Event|Ctx)Synchroni[sz]e")


_SYNC_KINDS = ("Device", "Stream", "Event", "Ctx")  # SYNC_CALL_RE's group 1


MEMCPY_CALL_RE = re.compile(r"^(?:cuda|hip|cu)Memcpy")


ITEM_OP_NAMES = ("aten::_local_scalar_dense", "aten::item")


_X = ord("X")


# Records of arrays: compared and printed by identity (a field-wise == of arrays raises, and their repr
# would print the arrays); generating __eq__ and __repr__ cost ~0.15 ms of every start.
class Gaps(msgspec.Struct, eq=False):
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


def idle_gaps(data: RankData) -> Gaps | None:
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
    return Gaps((gap_s[keep], gap_e[keep]), (gap_s[keep & host], gap_e[keep & host]), ending[keep])


def data_loader_stall(data: RankData, gaps: Gaps | None, loader: iv.Intervals) -> Finding | None:
    if iv.length(loader) == 0:
        return None
    has_gpu = gaps is not None
    stalled = iv.intersect(loader, gaps.all) if gaps is not None else loader
    name = _loader_name(data)
    where = "while the GPU sits idle" if has_gpu else "(no GPU activity: the step waits)"
    price = price_of(data, stalled, min_pct=DATALOADER_MIN_PCT)
    return priced(
        DATA_LOADER_STALL.id,
        data.rank,
        price,
        "data loader time" + (" with the GPU idle" if has_gpu else ""),
        f"The training loop waits {fmt_ms(price.ms)} per step ({fmt_p(price.pct)} of the step) on the DataLoader "
        f"(`{code_name(name)}`) {where}",
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


def sync_points(data: RankData, gaps: Gaps | None) -> tuple[Finding | None, iv.Intervals]:
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
    named = f", most of it after `{code_name(where[0])}` ({where[1]} of them)" if where else ""
    finding = priced(
        SYNC_POINTS.id,
        data.rank,
        price,
        "GPU idle time after the syncs that drained it",
        f"{len(costly)} of the {len(rows)} host synchronisations leave the GPU idle afterwards, "
        f"{fmt_ms(price.ms)} per step ({fmt_p(price.pct)} of the step){named}",
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
        bounds = np.append(np.flatnonzero(tree.new_thread(table.columns)), len(ops)).tolist()
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


def host_waits(data: RankData, gaps: Gaps | None, claimed: iv.Intervals) -> Finding | None:
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
            LAUNCH_BOUND.id,
            data.rank,
            price,
            what,
            f"The GPU waits {fmt_ms(price.ms)} per step ({fmt_p(price.pct)} of the step) for the CPU to launch "
            f"{per_step:.0f} kernels per step, {fmt_p(short_pct)} of them shorter than "
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
    first: iv.Intervals | None = None  # the waits in the leading phase
    for i, (phase_ns, phase) in enumerate(ranked[:2]):
        if i and phase_ns < cost / 10:
            break
        stretch = (
            iv.intersect(waits, unions[phase]) if phase in unions else iv.subtract(waits, all_of(unions))
        )
        ops = host.ops_during(data.table, stretch, top=1)
        decisive = ops and ops[0].ns >= phase_ns / 4
        held = (
            f"mostly `{code_name(ops[0].name)}`, {fmt_ns(ops[0].mean_call_ns)} per call"
            if decisive
            else "no single op accounts for it"
        )
        median_ms = price.median_ms(stretch)
        parts.append(f"in {host.PHASE_LABELS[phase]} for {fmt_ms(median_ms)} of it ({held})")
        helds.append(held)
        if i == 0:
            first = stretch
            top_op = ops[0] if decisive else None
        evidence[f"{phase}_ms_per_step"] = median_ms
        if decisive:
            evidence[f"{phase}_top_op"] = ops[0].name
            evidence[f"{phase}_top_op_ms_per_call"] = ms(ops[0].mean_call_ns)
    phase = ranked[0][1] if ranked else "other"
    evidence["phase"] = phase
    annotated = any(len(u[0]) for p, u in unions.items() if p != "data_loader")
    action = PHASE_ACTIONS.get(phase, PHASE_ACTIONS["other"])
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
        action = f"make `{code_name(top_op.name)}` cheaper on the CPU or move it off the step's path"
    elif top_op is None and first is not None and phase != "other" and iv.length(first):
        # no op holds the waits in a phase: where most of them run no torch op at all, the host is in Python (not
        # in the phase's ops: a fused optimizer, torch.compile would not help; the advice for "other" is Python's)
        outside = iv.length(iv.intersect(first, host.untraced_time(data.table, data.lo, data.hi)))
        if outside >= OUTSIDE_OPS_MIN_SHARE * iv.length(first):
            share = 100 * outside / iv.length(first)
            evidence["outside_ops_pct"] = round(share, 2)
            parts[0] = parts[0].replace(
                "(no single op accounts for it)", f"(no torch op runs in {fmt_p(share)} of it: Python)"
            )
            during = "during those waits the CPU is " + " and ".join(parts)
            action = python_action(f"the {host.PHASE_LABELS[phase]} phase")
    return priced(
        HOST_BOUND.id,
        data.rank,
        price,
        what,
        f"The GPU waits {fmt_ms(price.ms)} per step ({fmt_p(price.pct)} of the step) for the CPU; {during}",
        action,
        evidence,
    )


def tiny_kernels(data: RankData, gaps: Gaps | None) -> Finding | None:
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
        TINY_KERNELS.id,
        data.rank,
        price,
        "GPU idle between queued kernels shorter than 5 us",
        f"{fmt_p(share)} of the kernels ({n_tiny / price.steps:.0f} per step) run under "
        f"{TINY_KERNEL_NS / 1000:g} us, most often `{code_name(g.names[top])}` ({int(counts.max())}x); the GPU idles "
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


def pageable_copies(data: RankData) -> Finding | None:
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
        PAGEABLE_COPIES.id,
        data.rank,
        price,
        "time of host-to-device copies from pageable memory",
        f"{int(sel.sum()) / price.steps:.0f} host-to-device copies per step come from pageable memory and "
        f"take {fmt_ms(price.ms)} per step",
        "use pin_memory=True in the DataLoader and .to(device, non_blocking=True)",
        {"copies": int(sel.sum()), "bytes": int(nbytes[nbytes >= 0].sum())},
    )
