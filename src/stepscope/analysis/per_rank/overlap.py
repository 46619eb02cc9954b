"""Communication / computation overlap: how much of the communication time is hidden behind computation.

overlap % = |union(communication) ∩ union(computation)| / |union(communication)|, as HTA defines it; null when the
rank runs no communication kernels.
"""

from __future__ import annotations

import msgspec

from stepscope.analysis import intervals as iv
from stepscope.analysis.per_rank.kernels import COMMUNICATION, COMPUTATION, GpuEvents
from stepscope.analysis.per_rank.steps import ns_to_us, pct


class CommOverlap(msgspec.Struct):
    """Communication time of one rank and the part of it overlapped by computation kernels."""

    comm_us: float
    overlapped_us: float
    exposed_us: float  # communication with no computation running: the GPU waits on the network
    overlap_pct: float | None


def comm_compute_overlap(gpu: GpuEvents) -> CommOverlap:
    """Overlap of communication with computation kernels (unions of each, so concurrent kernels count once)."""
    comm = gpu.of_kind(COMMUNICATION)
    comp = gpu.of_kind(COMPUTATION)
    comm_u = iv.merge(comm.start, comm.end)
    both = iv.length(iv.intersect(comm_u, iv.merge(comp.start, comp.end)))
    total = iv.length(comm_u)
    return CommOverlap(
        comm_us=ns_to_us(total),
        overlapped_us=ns_to_us(both),
        exposed_us=ns_to_us(total - both),
        overlap_pct=pct(both, total),
    )
