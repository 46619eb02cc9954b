"""Expert-parallel findings: MoE all-to-all communication (all_to_all(v), DeepEP's dispatch / combine / notify
kernels) that the step waits for (`ep_comm_exposed`), priced by that exposed time. The action follows the
evidence: imbalanced ranks -> balance the experts; small messages on DeepEP's normal kernels -> its low-latency
kernels; otherwise overlap dispatch and combine with computation."""

from __future__ import annotations

from stepscope.analysis.findings.pricing import Finding, price_of, priced
from stepscope.analysis.findings.rule import Rule
from stepscope.analysis.per_rank.parallelism.expert import ExpertPart, Imbalance
from stepscope.analysis.per_rank.prepare import RankDigest
from stepscope.units import fmt_bytes, fmt_ms, fmt_pct

EP_COMM_EXPOSED = Rule(
    "ep_comm_exposed",
    "parallelism",
    "the all-to-all time (expert parallel, embedding exchange) with no computation running under it",
)
RULES = (EP_COMM_EXPOSED,)

# ep_comm_exposed: exposed expert-parallel communication, % of the step.
EP_EXPOSED_MIN_PCT = 5.0
# ... its action is "balance the experts" when a figure's max / mean across ranks reaches this ...
EP_IMBALANCE_MIN_RATIO = 1.25
# ... else "low-latency kernels" when the all-to-alls average less than this many bytes (and the rank runs no
# low_latency kernels already) ...
EP_SMALL_MESSAGE_BYTES = 256 << 10
# ... else "overlap dispatch / combine with computation".

BALANCE = (
    "balance what the ranks send: the experts' load (a capacity factor, an auxiliary load-balancing loss or "
    "bias, redundant copies of the hot experts) or, for embedding tables, their sharding"
)
LOW_LATENCY = (
    "use low-latency all-to-all kernels for these small batches (DeepEP's low_latency mode, "
    "low_latency_dispatch / low_latency_combine)"
)
OVERLAP = (
    "overlap dispatch and combine with computation (DeepEP's async mode and receive hooks, "
    "or two micro-batches whose all-to-all runs under the other's computation)"
)
# without DeepEP-style kernels the all-to-all may be an MoE's or an embedding exchange's (DLRM)
OVERLAP_ANY = (
    "overlap the all-to-all with computation: issue it ahead of its use (async_op=True) so that other work runs "
    "under it (for MoE, two micro-batches whose all-to-all runs under the other's computation; for embedding "
    "lookups, the next batch's exchange under this one's dense layers)"
)


def ep_findings(
    parts: dict[int, ExpertPart], digests: dict[int, RankDigest], imbalance: list[Imbalance]
) -> list[Finding]:
    """`ep_comm_exposed` per rank whose expert-parallel communication is exposed."""
    worst = max(imbalance, key=lambda i: i.ratio, default=None)
    out = []
    for rank, part in sorted(parts.items()):
        digest = digests.get(rank)
        stats = part.stats
        if digest is None or stats.exposed_ms <= 0:
            continue
        price = price_of(digest, part.exposed, min_pct=EP_EXPOSED_MIN_PCT)
        a2a = stats.all_to_all
        mean_bytes = (
            a2a.sent_bytes / a2a.count
            if a2a is not None and a2a.sent_bytes is not None and a2a.count
            else None
        )
        transports = sorted({k.transport for k in stats.ep_kernels})
        if worst is not None and worst.ratio >= EP_IMBALANCE_MIN_RATIO:
            action = BALANCE
            why = (
                f"; the ranks are imbalanced: {worst.figure} max/mean {worst.ratio:.2f} "
                f"(rank {worst.max_rank} of {worst.ranks})"
            )
        elif (
            mean_bytes is not None and mean_bytes < EP_SMALL_MESSAGE_BYTES and "low_latency" not in transports
        ):
            action = LOW_LATENCY
            why = f"; its all-to-alls are small ({fmt_bytes(int(mean_bytes))} on average)"
        else:
            action = OVERLAP if transports else OVERLAP_ANY
            why = ""
        what = (
            f"all-to-all (MoE dispatch / combine: {', '.join(transports)} kernels)"
            if transports
            else "all-to-all"
        )
        found = priced(
            EP_COMM_EXPOSED.id,
            rank,
            price,
            "all-to-all communication time with no computation kernel running",
            f"Exposed {what} takes {fmt_ms(price.ms)} per step ({fmt_pct(price.pct)} of the step; part of any "
            f"comm_bound's exposed time){why}",
            action,
            {
                "exposed_ms": stats.exposed_ms,
                "all_to_all": a2a.count if a2a is not None else 0,
                "sent_bytes": a2a.sent_bytes if a2a is not None else None,
                "received_bytes": a2a.received_bytes if a2a is not None else None,
                "ep_kernel_ms": round(sum(k.time_ms for k in stats.ep_kernels), 3),
                "transports": ", ".join(transports) or None,
                "imbalance": None if worst is None else f"{worst.figure} {worst.ratio:.2f}",
            },
        )
        if found is not None:
            out.append(found)
    return out
