"""Rules about one rank's communication: exposed (`comm_bound`) and poorly overlapped (`poor_overlap`)."""

from __future__ import annotations

from stepscope.analysis import intervals as iv
from stepscope.analysis.findings._common import fmt_p, ms
from stepscope.analysis.findings.pricing import (
    Finding,
    price_of,
    priced,
)
from stepscope.analysis.findings.rule import Rule
from stepscope.analysis.per_rank.breakdown import Temporal
from stepscope.analysis.per_rank.kernels import COMMUNICATION, COMPUTATION
from stepscope.analysis.per_rank.overlap import CommOverlap
from stepscope.analysis.per_rank.prepare import RankData
from stepscope.analysis.per_rank.steps import pct
from stepscope.units import fmt_ms

COMM_BOUND = Rule("comm_bound", "communication", "the communication time not hidden behind computation")
POOR_OVERLAP = Rule("poor_overlap", "communication", "the communication time a better overlap would hide")
RULES = (COMM_BOUND, POOR_OVERLAP)

# comm_bound: communication not hidden by computation, priced by that exposed time.
COMM_EXPOSED_MIN_PCT = 10.0


# poor_overlap: communication kernels cover at least this share of the GPU span and overlap less than ...
POOR_OVERLAP_MIN_COMM_PCT = 5.0


POOR_OVERLAP_MAX_PCT = 30.0


def exposed_comm(data: RankData) -> tuple[iv.Intervals, iv.Intervals]:
    """The communication kernels' time (a union) and the part of it no computation kernel runs under (as
    overlap.comm_compute_overlap measures it, but as intervals: the price is taken step by step)."""
    comm, comp = data.gpu.of_kind(COMMUNICATION), data.gpu.of_kind(COMPUTATION)
    comm_u = iv.merge(comm.start, comm.end)
    return comm_u, iv.subtract(comm_u, iv.merge(comp.start, comp.end))


def comm_bound(data: RankData, temporal: Temporal | None, overlap: CommOverlap | None) -> Finding | None:
    if temporal is None or overlap is None or overlap.comm_us <= 0:
        return None
    comm, exposed = exposed_comm(data)
    price = price_of(data, exposed, min_pct=COMM_EXPOSED_MIN_PCT)
    return priced(
        COMM_BOUND.id,
        data.rank,
        price,
        "communication kernel time not overlapped by computation",
        f"Communication not overlapped with computation takes {fmt_ms(price.ms)} per step "
        f"({fmt_p(price.pct)} of the step); only {fmt_p(overlap.overlap_pct)} of the "
        f"{fmt_ms(price.median_ms(comm))} of communication per step runs under computation",
        "overlap it (DDP bucket_cap_mb, FSDP prefetch, async collectives waited on later) or send less",
        {
            "comm_ms": ms(overlap.comm_us * 1000),
            "overlap_pct": overlap.overlap_pct,
            "exposed_ms": ms(overlap.exposed_us * 1000),
        },
    )


def poor_overlap(
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
    price = price_of(data, exposed_comm(data)[1])
    return priced(
        POOR_OVERLAP.id,
        data.rank,
        price,
        "communication kernel time not overlapped by computation",
        f"Only {fmt_p(overlap.overlap_pct)} of the communication ({fmt_ms(overlap.comm_us / 1000)}) runs under "
        f"computation; the rest costs {fmt_ms(price.ms)} per step",
        "issue collectives earlier (DDP bucket_cap_mb, FSDP forward/backward prefetch, async ops waited on later)",
        {
            "comm_ms": ms(overlap.comm_us * 1000),
            "comm_pct_of_span": comm_pct,
            "overlap_pct": overlap.overlap_pct,
        },
    )
