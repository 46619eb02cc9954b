"""GPU communication judged by its transfer, not by the waiting: `comm_bound` and `poor_overlap`, priced per rank
from the kernels (comm_rank.py), are priced again once the collectives are matched across ranks.

A rank's NCCL kernel starts when the rank arrives and ends when the data has moved, after the last rank arrived:
the time from its arrival to the last rank's is waiting for peers, which neither overlapping nor sending less wins
back (only the late rank's own work does: the straggler finding charges it there). Where the waiting of a rank's
collectives is known (each matched with every rank of its group: comm.waiting_known), its unhidden communication
less that waiting is priced; a finding left with too little transfer is dropped. Where it is not known (one rank
traced, or collectives that could not be matched), the finding keeps its price and says that part of it may be
waiting.
"""

from __future__ import annotations

import msgspec
import numpy as np

from stepscope.analysis import intervals as iv
from stepscope.analysis.cross_rank.distributed import Distributed
from stepscope.analysis.findings._common import fmt_p
from stepscope.analysis.findings.comm import TRACE_ALL, waiting_known
from stepscope.analysis.findings.comm_rank import COMM_BOUND, COMM_EXPOSED_MIN_PCT, POOR_OVERLAP
from stepscope.analysis.findings.pricing import FINDING_MIN_PCT, Finding, price_of, priced
from stepscope.analysis.findings.replayed import by_saving
from stepscope.analysis.per_rank.comm.collectives import Instances
from stepscope.analysis.per_rank.prepare import RankDigest
from stepscope.units import fmt_ms

JUDGED = {COMM_BOUND.id: COMM_EXPOSED_MIN_PCT, POOR_OVERLAP.id: FINDING_MIN_PCT}


def transfer_only(
    findings: list[Finding], instances: dict[int, Instances], dist: Distributed, ranks: dict[int, RankDigest]
) -> list[Finding]:
    """`findings` with each GPU rank's comm_bound and poor_overlap priced by its transfer (the module doc)."""
    known = waiting_known(instances, dist, ranks)
    out: list[Finding] = []
    for f in findings:
        digest = ranks.get(f.rank) if f.rank is not None else None
        inst = instances.get(f.rank) if f.rank is not None else None
        if (
            f.id not in JUDGED
            or digest is None
            or inst is None
            or digest.comm_unhidden is None
            or inst.time_source != "device"
        ):
            out.append(f)
        elif not known[inst.rank].any():
            out.append(_unknown(f, inst, digest, len(ranks)))
        else:
            found = _transfer(f, inst, digest, known[inst.rank], dist.wait_ns[inst.rank])
            if found is not None:
                out.append(found)
    return out


def _transfer(
    f: Finding, inst: Instances, digest: RankDigest, known: np.ndarray, wait_ns: np.ndarray
) -> Finding | None:
    """`f` priced by the unhidden communication less the waiting of the instances whose waiting is known."""
    assert digest.comm_unhidden is not None
    start = inst.start[known]
    waits = np.clip(wait_ns[known], 0, inst.end[known] - start)
    waiting = iv.merge(start, start + waits)
    unhidden = digest.comm_unhidden
    price = price_of(digest, iv.subtract(unhidden, waiting), min_pct=JUDGED[f.id])
    waited_ms = price.median_ms(iv.intersect(unhidden, waiting))
    action = f.action
    found = priced(
        f.id,
        f.rank,
        price,
        "communication kernel time not overlapped by computation, less the waiting for peers",
        f"Communication not overlapped with computation moves data for {fmt_ms(price.ms)} per step "
        f"({fmt_p(price.pct)} of the step), besides {fmt_ms(waited_ms)} per step of waiting for the last rank "
        "to arrive (the straggler's to win back, not this rank's)",
        action,
        {**{k: v for k, v in f.evidence.items() if k != "arithmetic"}, "waiting_ms": waited_ms},
    )
    if found is None:
        return None
    if f.saving_from == "replay" and f.saving_ms_per_step is not None:
        found = msgspec.structs.replace(
            found,
            saving_ms_per_step=min(f.saving_ms_per_step, found.cost_ms_per_step or 0.0),
            saving_from="replay",
            whatif=f.whatif,
            saving_note=f"{f.saving_note}; at most the transfer's price ({found.cost_ms_per_step} ms)",
        )
        found = by_saving(found, price.step_median_ns)
    return found


def _unknown(f: Finding, inst: Instances, digest: RankDigest, traced: int) -> Finding:
    """`f` as priced, saying that its time may be waiting for peers, which cannot be told apart here."""
    sizes = inst.group_size[inst.group_size > 0]
    size = int(sizes.max()) if len(sizes) else (digest.world_size or 0)
    if size <= 1:
        return f
    if traced < size:
        who = (
            f"only {traced} of the {size} ranks of its process group {'is' if traced == 1 else 'are'} traced"
        )
    else:
        who = "its collectives could not be matched with the same collectives on the other ranks"
    note = (
        f" Part of this time may be waiting for slower peers, which no overlap wins back: {who}, so waiting "
        f"cannot be told from transfer ({TRACE_ALL})."
    )
    return msgspec.structs.replace(f, message=f.message + note, evidence={**f.evidence, "waiting_known": 0})


__all__ = ["JUDGED", "transfer_only"]
