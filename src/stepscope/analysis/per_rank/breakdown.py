"""Temporal breakdown (idle / compute / non-compute over the GPU span, HTA's definitions), kernel types, top kernels.

Definitions (comparable with HTA's temporal breakdown): span = end of the last GPU activity - start of the first;
idle = span - union of all GPU activity; compute = union of computation kernels; non-compute = union of all GPU
activity - compute. GPU activity is kernels, memcpy and memset.
"""

from __future__ import annotations

import msgspec
import numpy as np

from stepscope.analysis import intervals as iv
from stepscope.analysis.codes import unique_inverse
from stepscope.analysis.per_rank.kernels import COMPUTATION, KIND_NAMES, GpuEvents
from stepscope.analysis.per_rank.steps import ns_to_us, pct


class Temporal(msgspec.Struct):
    """Where the GPU span of one rank went."""

    span_us: float
    idle_us: float
    compute_us: float
    non_compute_us: float
    idle_pct: float | None
    compute_pct: float | None
    non_compute_pct: float | None


class KernelTypeStat(msgspec.Struct):
    """One kernel type: how many, summed duration, and wall time covered (union) as % of the GPU span."""

    type: str
    count: int
    total_us: float
    busy_us: float
    busy_pct: float | None


class KernelTypeCombo(msgspec.Struct):
    """Wall time during which exactly these kernel types run together (e.g. communication + computation)."""

    types: list[str]
    time_us: float
    pct: float | None  # of GPU busy time (the combos add up to 100)


class KernelTypes(msgspec.Struct):
    by_type: list[KernelTypeStat]
    combos: list[KernelTypeCombo]


class TopKernel(msgspec.Struct):
    name: str
    count: int
    total_us: float
    pct: float | None  # of the summed duration of all GPU activity


def temporal_breakdown(gpu: GpuEvents) -> Temporal | None:
    """Idle / compute / non-compute time of GPU activity; None when there is none."""
    if len(gpu) == 0:
        return None
    span = int(gpu.end.max() - gpu.start.min())
    busy = iv.length(iv.merge(gpu.start, gpu.end))
    comp = gpu.of_kind(COMPUTATION)
    compute = iv.length(iv.merge(comp.start, comp.end))
    idle, non_compute = span - busy, busy - compute
    return Temporal(
        span_us=ns_to_us(span),
        idle_us=ns_to_us(idle),
        compute_us=ns_to_us(compute),
        non_compute_us=ns_to_us(non_compute),
        idle_pct=pct(idle, span),
        compute_pct=pct(compute, span),
        non_compute_pct=pct(non_compute, span),
    )


def kernel_type_breakdown(gpu: GpuEvents) -> KernelTypes | None:
    """Per-type counts and times, and the exclusive time of each combination of types running together."""
    if len(gpu) == 0:
        return None
    span = int(gpu.end.max() - gpu.start.min())
    unions = []
    by_type = []
    for kind, label in enumerate(KIND_NAMES):
        sel = gpu.kind == kind
        union = iv.merge(gpu.start[sel], gpu.end[sel])
        unions.append(union)
        busy = iv.length(union)
        total = int((gpu.end[sel] - gpu.start[sel]).sum())
        by_type.append(
            KernelTypeStat(label, int(sel.sum()), ns_to_us(total), ns_to_us(busy), pct(busy, span))
        )
    exclusive = iv.exclusive_time_by_mask(unions)
    busy_all = int(exclusive.sum())
    combos = [
        KernelTypeCombo(
            [label for bit, label in enumerate(KIND_NAMES) if mask & (1 << bit)],
            ns_to_us(int(exclusive[mask])),
            pct(int(exclusive[mask]), busy_all),
        )
        for mask in np.argsort(-exclusive, kind="stable")
        if exclusive[mask] > 0
    ]
    return KernelTypes(by_type, combos)


def top_kernels(gpu: GpuEvents, n: int = 10) -> list[TopKernel]:
    """The `n` GPU activity names with the largest summed duration."""
    if len(gpu) == 0:
        return []
    dur = gpu.end - gpu.start
    ids, inverse = unique_inverse(gpu.name)
    total = np.bincount(inverse, weights=dur).astype(np.int64)
    count = np.bincount(inverse)
    everything = int(dur.sum())
    order = np.lexsort((ids, -total))[:n]
    return [
        TopKernel(
            gpu.names[int(ids[i])], int(count[i]), ns_to_us(int(total[i])), pct(int(total[i]), everything)
        )
        for i in order
    ]
