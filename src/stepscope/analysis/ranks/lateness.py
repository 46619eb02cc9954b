"""Is a rank late more often than jitter makes it? The test that tells a straggler from noise.

At each matched instance of a process group, the rank that arrives last makes the others wait; call that waiting
(the mean over the other ranks of their waits) the delay the instance charges to it. If no rank is slower than the
others and only jitter decides the arrival order, the ranks are exchangeable: each instance's delay goes to any of
its n ranks with the same chance 1/n, whatever its size. A rank's share of the group's delay is then that of a
binomial draw: over k equal delays, Binomial(k, 1/n) / k. Delays are not equal, and one large delay is one piece of
evidence, not many: the weighted count of instances is Kish's effective number, (sum of delays)^2 / (sum of
squared delays). Nor are consecutive instances independent: a rank held up once (a preempted process, a page
fault) is often last at several collectives in a row, which says nothing new. How the order changes from
collective to collective measures that: the persistence `phi` is how much more often the last rank is the same
as at the instance before than the ranks' shares make it by chance (0: each instance independent; 1: one run),
and the effective number is multiplied by (1 - phi) / (1 + phi), the factor by which a lag-one correlation
`phi` shrinks a sample.

A rank is consistently late when its share of the delay, as successes out of the effective number of instances,
is beyond what Binomial(effective, 1/n) gives with probability STRAGGLER_ALPHA / n (one-sided, Bonferroni over
the group's n ranks). straggler.py names such a rank a straggler when its delay is material too.
"""

from __future__ import annotations

import msgspec
import numpy as np

STRAGGLER_ALPHA = 0.001  # chance that jitter alone makes any rank of a group a straggler (at most)
PERSISTENCE_MAX = 0.95


class Arrivals(msgspec.Struct, eq=False):
    """A group's matched instances at which some rank waited, in time order: the rank that arrived last, the
    delay it charged (the other ranks' mean wait, ns) and how many ranks the instance matched."""

    latest: list[int] = msgspec.field(default_factory=list)
    delay_ns: list[float] = msgspec.field(default_factory=list)
    size: list[int] = msgspec.field(default_factory=list)

    def add(self, latest: int, delay_ns: float, size: int) -> None:
        if delay_ns > 0:
            self.latest.append(latest)
            self.delay_ns.append(delay_ns)
            self.size.append(size)


class Lateness(msgspec.Struct):
    """The test of one group (module doc): its instances, their effective number and, per rank that was last at
    some instance, its share of the delay and the chance that jitter gives a share that large."""

    instances: int  # matched instances at which some rank waited
    effective_instances: float  # Kish's number times (1 - persistence) / (1 + persistence)
    persistence: float  # phi (module doc)
    chance: float  # 1 / ranks per instance: a rank's expected share under jitter
    share: dict[int, float]  # rank -> its share of the delay, 0..1
    last_at: dict[int, int]  # rank -> the instances at which it arrives last
    p_value: dict[int, float]  # rank -> one-sided binomial tail at its share

    def consistent(self, rank: int, ranks: int) -> bool:
        """Whether `rank` is late beyond jitter, among `ranks` ranks tested (Bonferroni)."""
        return self.p_value.get(rank, 1.0) < STRAGGLER_ALPHA / max(ranks, 1)

    @property
    def decidable(self) -> bool:
        """Whether any rank could be found consistently late with this many effective instances: a rank last at
        every one of them must reach the threshold."""
        n = round(self.effective_instances)
        return n > 0 and self.chance**n < STRAGGLER_ALPHA / max(round(1 / self.chance), 1)


def judge(arrivals: Arrivals) -> Lateness | None:
    """The test of a group's arrivals (module doc); None when nobody waited."""
    k = len(arrivals.latest)
    if k == 0:
        return None
    latest = np.asarray(arrivals.latest, dtype=np.int64)
    delay = np.asarray(arrivals.delay_ns, dtype=np.float64)
    chance = float(np.mean(1.0 / np.maximum(np.asarray(arrivals.size, dtype=np.float64), 2.0)))
    ranks, at, counts = np.unique(latest, return_inverse=True, return_counts=True)
    total = float(delay.sum())
    shares = np.bincount(at, weights=delay, minlength=len(ranks)) / total
    phi = persistence(at, len(ranks))
    kish = total**2 / float(np.square(delay).sum())
    effective = kish * (1.0 - phi) / (1.0 + phi)
    n = max(round(effective), 1)
    tail = binomial_tail(n, chance)
    successes = np.clip(np.round(shares * n).astype(np.int64), 0, n)
    return Lateness(
        instances=k,
        effective_instances=round(effective, 2),
        persistence=round(phi, 3),
        chance=chance,
        share={int(r): float(s) for r, s in zip(ranks.tolist(), shares.tolist(), strict=True)},
        last_at={int(r): int(c) for r, c in zip(ranks.tolist(), counts.tolist(), strict=True)},
        p_value={int(r): float(tail[x]) for r, x in zip(ranks.tolist(), successes.tolist(), strict=True)},
    )


def persistence(at: np.ndarray, ranks: int) -> float:
    """phi: how much more often consecutive instances have the same last rank than the ranks' shares of the
    instances make it by chance, as a share of what is left to 1 (0 when each rank is last alone or never
    twice running beyond chance)."""
    if len(at) < 2:
        return 0.0
    counts = np.bincount(at, minlength=ranks).astype(np.float64)
    by_chance = float(np.square(counts / len(at)).sum())
    if by_chance >= 1.0:
        return 0.0  # one rank last at every instance: no change of order to measure
    same = float(np.mean(at[1:] == at[:-1]))
    return float(np.clip((same - by_chance) / (1.0 - by_chance), 0.0, PERSISTENCE_MAX))


def binomial_tail(n: int, p: float) -> np.ndarray:
    """P(X >= x) for x = 0..n, X ~ Binomial(n, p), in log space (n may be large)."""
    x = np.arange(n + 1, dtype=np.float64)
    steps = np.log(np.arange(n, 0, -1, dtype=np.float64)) - np.log(np.arange(1, n + 1, dtype=np.float64))
    log_choose = np.r_[0.0, np.cumsum(steps)]
    log_pmf = log_choose + x * np.log(p) + (n - x) * np.log1p(-p)
    pmf = np.exp(log_pmf - log_pmf.max())
    pmf /= pmf.sum()
    return np.minimum(np.cumsum(pmf[::-1])[::-1], 1.0)
