"""Expert parallel (MoE) communication of one rank, and its imbalance across ranks: the all-to-all(v) the job
issued (`c10d::alltoall_base_`, `_c10d_functional::all_to_all_single`, record_param_comms `all_to_all`) with
their bytes and tokens, and DeepEP's (or a fork's) dispatch / combine / notify kernels by phase
(comm_names.ep_kernel). The rules are documented in docs/analysis.md ("Expert parallel").
"""

from __future__ import annotations

import msgspec
import numpy as np

from stepscope.analysis import intervals as iv
from stepscope.analysis.per_rank.comm.issued_ops import issued_ops
from stepscope.analysis.per_rank.comm_names import ep_kernel
from stepscope.analysis.per_rank.kernels import COMPUTATION
from stepscope.analysis.per_rank.prepare import RankData

ALL_TO_ALL = frozenset({"all_to_all"})


class AllToAll(msgspec.Struct):
    """The all-to-all(v) collectives one rank issued in the window."""

    count: int
    sent_bytes: int | None  # input messages summed; null when a size is missing
    received_bytes: int | None
    sent_tokens: int | None  # rows of the inputs (split sizes summed); null when no split is recorded
    received_tokens: int | None
    uneven: bool  # some recorded split differs from the others (all_to_allv)
    time_ms: float | None  # union of what ran them (kernels, or the CPU backend's ranges)
    time_source: str | None  # device | cpu | null (only counted)
    exposed_ms: float | None  # device time with no computation kernel running; null on CPU backends


class EpKernels(msgspec.Struct):
    """DeepEP-style kernels of one transport and phase on one rank."""

    transport: str  # intranode | internode | low_latency | elastic
    phase: str  # notify | dispatch | combine | barrier
    count: int
    time_ms: float  # union of the kernels
    exposed_ms: float  # the part with no computation kernel running


class ExpertRank(msgspec.Struct):
    """One rank's expert-parallel communication over the window."""

    rank: int
    steps: int
    all_to_all: AllToAll | None
    ep_kernels: list[EpKernels]
    exposed_ms: float  # all of it (all-to-all and DeepEP kernels) with no computation running, a union


class Imbalance(msgspec.Struct):
    """One figure across the ranks that have it: its largest value over the mean (1.0: balanced)."""

    figure: str  # sent_bytes | received_bytes | received_tokens | ep_time_ms
    max: float
    mean: float
    ratio: float  # max / mean
    max_rank: int
    ranks: int


class Expert(msgspec.Struct):
    """`analyze --json`'s `expert`: per rank, then the imbalance across ranks (empty with one rank)."""

    ranks: list[ExpertRank]
    imbalance: list[Imbalance]


class ExpertPart(msgspec.Struct):
    """A rank's expert view and its exposed intervals (for the finding's price)."""

    stats: ExpertRank
    exposed: iv.Intervals


def _ms(ns: int) -> float:
    return round(ns / 1e6, 6)


def expert_rank(data: RankData) -> ExpertPart | None:
    """The rank's all-to-alls and DeepEP kernels in its window; None when it has neither."""
    ops = issued_ops(data, ALL_TO_ALL)
    gpu = data.gpu
    phases = data.table.name_values(ep_kernel, object, key="ep_kernel", among=gpu.name) if len(gpu) else None
    if phases is not None and not np.array([p is not None for p in phases], dtype=bool)[gpu.name].any():
        phases = None  # (no DeepEP kernel: nothing to go over kernel by kernel)
    if not ops and phases is None:
        return None
    kernels: list[EpKernels] = []
    exposed_parts: list[iv.Intervals] = []
    if phases is not None:
        compute = data.gpu_all.of_kind(COMPUTATION)
        busy = iv.merge(compute.start, compute.end)
        found = [phases[n] for n in gpu.name.tolist()]
        keys = sorted({f for f in found if f is not None}, key=lambda k: (k[0], _PHASE_ORDER.get(k[1], 9)))
        for transport, phase in keys:
            idx = np.array([i for i, f in enumerate(found) if f == (transport, phase)], dtype=np.int64)
            time = iv.merge(gpu.start[idx], gpu.end[idx])
            exposed = iv.subtract(time, busy)
            exposed_parts.append(exposed)
            kernels.append(
                EpKernels(transport, phase, len(idx), _ms(iv.length(time)), _ms(iv.length(exposed)))
            )
    if not ops and not kernels:
        return None
    a2a = None
    if ops:
        time = iv.merge(np.concatenate([o.time[0] for o in ops]), np.concatenate([o.time[1] for o in ops]))
        sources = {o.time_source for o in ops}
        source = sources.pop() if len(sources) == 1 else None
        exposed_ms = None
        if source == "device":
            op_exposed = iv.merge(
                np.concatenate([o.exposed[0] for o in ops if o.exposed is not None]),
                np.concatenate([o.exposed[1] for o in ops if o.exposed is not None]),
            )
            exposed_parts.append(op_exposed)
            exposed_ms = _ms(iv.length(op_exposed))
        splits = [s for o in ops for s in (o.in_split, o.out_split) if s]
        a2a = AllToAll(
            count=len(ops),
            sent_bytes=_total([o.in_bytes for o in ops]),
            received_bytes=_total([o.out_bytes for o in ops]),
            sent_tokens=_total([sum(o.in_split) if o.in_split else None for o in ops]),
            received_tokens=_total([sum(o.out_split) if o.out_split else None for o in ops]),
            uneven=any(len(set(s)) > 1 for s in splits),
            time_ms=_ms(iv.length(time)) if source else None,
            time_source=source,
            exposed_ms=exposed_ms,
        )
    exposed_all = iv.merge(
        np.concatenate([e[0] for e in exposed_parts] or [np.zeros(0, np.int64)]),
        np.concatenate([e[1] for e in exposed_parts] or [np.zeros(0, np.int64)]),
    )
    stats = ExpertRank(data.rank, len(data.steps), a2a, kernels, _ms(iv.length(exposed_all)))
    return ExpertPart(stats, exposed_all)


_PHASE_ORDER = {"notify": 0, "dispatch": 1, "combine": 2, "barrier": 3}


def _total(values: list[int | None]) -> int | None:
    return None if not values or any(v is None for v in values) else sum(v for v in values if v is not None)


def imbalance(ranks: list[ExpertRank]) -> list[Imbalance]:
    """Per figure, max / mean across the ranks that have it (two ranks or more)."""
    figures: dict[str, list[tuple[int, float]]] = {}
    for r in ranks:
        a = r.all_to_all
        values = {
            "sent_bytes": a.sent_bytes if a else None,
            "received_bytes": a.received_bytes if a else None,
            "received_tokens": a.received_tokens if a else None,
            "ep_time_ms": sum(k.time_ms for k in r.ep_kernels if k.phase in ("dispatch", "combine"))
            if r.ep_kernels
            else None,
        }
        for figure, value in values.items():
            if value is not None:
                figures.setdefault(figure, []).append((r.rank, float(value)))
    out = []
    for figure, pairs in figures.items():
        if len(pairs) < 2:
            continue
        mean = sum(v for _, v in pairs) / len(pairs)
        top_rank, top = max(pairs, key=lambda p: (p[1], -p[0]))
        if mean <= 0:
            continue
        out.append(
            Imbalance(figure, round(top, 6), round(mean, 6), round(top / mean, 4), top_rank, len(pairs))
        )
    return out
