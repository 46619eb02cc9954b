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
as at the instances before than the ranks' shares make it by chance, each pair of instances weighted by their
delays (from the integrated autocorrelation tau of the ranks' delay series, phi = 1 - 1 / tau; 0: each instance
independent; near 1: one run), and the effective number is multiplied by (1 - phi) = 1 / tau, as a correlated
series of n values tells as much as n / tau independent ones.

The test has two stages. First, is the order exchangeable at all? The ranks' shares, as counts out of the
effective number of instances, are compared with the equal counts jitter gives by Pearson's chi-square (n - 1
degrees of freedom); jitter alone rejects it with probability STRAGGLER_ALPHA. Only then are the ranks tested,
largest share first, each among the ranks not yet named: a rank is consistently late when its share, as
successes out of the effective number of the instances left (those the ranks named before it were not last at),
is beyond what Binomial(left, 1 / ranks left) gives with probability RANK_ALPHA / n (one-sided, Bonferroni over
the group's n ranks); the first rank that is not stops the naming.
The first stage keeps jitter-only jobs from naming anyone (the chance of a straggler from noise is at most
STRAGGLER_ALPHA); the second names every rank that stands out, several when several do.

Who is last cannot tell much from few instances: two ranks need 11 independent ones before a rank last at every
one of them passes the first stage. The size of the delays can: a rank late by 40 ms in each of 3 steps, where
jitter moves the order by a millisecond, is no accident. The magnitude test takes the steps as its units (a
hold-up that lasts several collectives stays within one step): per step, the delay charged to the rank less the
mean charged to each other rank, whose mean over the steps jitter leaves at 0; a rank whose mean is beyond 0 by
Student's t (one-sided, steps - 1 degrees of freedom, from MIN_STEPS steps) with p < MAGNITUDE_ALPHA / n is
named too (3 steps: a rank's lateness per step within about 14% of its mean), when it also holds most of the
group's waiting (MAGNITUDE_MIN_SHARE): with few steps only a rank the others wait for most is named this way (on
jitter-only jobs of 4 ranks, 1 in 100 passed the t-test alone, holding 37% of the waiting; an FSDP2 rank that
sleeps 20 ms in forward holds two thirds of it, from one all-gather of 12 a step). A heavy-tailed hold-up in one step or two of three leaves t small (its spread is as large as its
mean); the same lateness in every step does not. With fewer than MIN_STEPS steps the instances are the units
instead, as many as the persistence leaves independent (the effective number above). straggler.py names such
a rank a straggler when its delay is material too.
"""

from __future__ import annotations

import math

import msgspec
import numpy as np

from stepscope.analysis.stats import t_sf

STRAGGLER_ALPHA = 0.001  # chance that jitter alone makes the arrival order of a group look not exchangeable
RANK_ALPHA = 0.05  # then, per group, the chance of naming a rank that is only as late as jitter makes it
PERSISTENCE_MAX = 0.95
MAX_LAG = 50  # instances: the longest run of one lateness the persistence looks for
MIN_STEPS = 3  # steps for the magnitude test (Student's t on 2 degrees of freedom at least)
MAGNITUDE_ALPHA = 0.01  # per group: the chance that jitter passes the magnitude test (Bonferroni over ranks)
MAGNITUDE_MIN_SHARE = 0.5  # ... which names only a rank that holds most of the group's waiting


class Arrivals(msgspec.Struct, eq=False):
    """A group's matched instances at which some rank waited, in time order: the rank that arrived last, the
    delay it charged (the other ranks' mean wait, ns) and how many ranks the instance matched."""

    latest: list[int] = msgspec.field(default_factory=list)
    delay_ns: list[float] = msgspec.field(default_factory=list)
    size: list[int] = msgspec.field(default_factory=list)
    step: list[int] = msgspec.field(default_factory=list)  # the ProfilerStep of each instance (-1: unknown)

    def add(self, latest: int, delay_ns: float, size: int, step: int = -1) -> None:
        if delay_ns > 0:
            self.latest.append(latest)
            self.delay_ns.append(delay_ns)
            self.size.append(size)
            self.step.append(step)


class Lateness(msgspec.Struct):
    """The test of one group (module doc): its instances, their effective number and, per rank that was last at
    some instance, its share of the delay and the chance that jitter gives a share that large."""

    instances: int  # matched instances at which some rank waited
    effective_instances: float  # Kish's number times (1 - persistence) / (1 + persistence)
    persistence: float  # phi (module doc)
    chance: float  # 1 / ranks per instance: a rank's expected share under jitter
    p_order: float  # the chance that jitter gives an order this far from exchangeable (chi-square)
    share: dict[int, float]  # rank -> its share of the delay, 0..1
    last_at: dict[int, int]  # rank -> the instances at which it arrives last
    p_value: dict[int, float]  # rank -> one-sided binomial tail at its share, among the ranks left
    named: list[int] = msgspec.field(default_factory=list)  # consistently late, largest share first
    steps: int = 0  # steps with instances at which someone waited (the magnitude test's units)
    p_step: dict[int, float] = msgspec.field(default_factory=dict)  # rank -> the magnitude test's p-value

    def consistent(self, rank: int, ranks: int) -> bool:
        """Whether `rank` is late beyond jitter, among `ranks` ranks tested (the module doc's two stages)."""
        return rank in self.named

    @property
    def decidable(self) -> bool:
        """Whether any rank could be found consistently late with this many effective instances: one rank last
        at every one of them must pass both stages."""
        n = round(self.effective_instances)
        ranks = max(round(1 / self.chance), 2)
        return (n > 0 and chi2_sf(n * (ranks - 1), ranks - 1) < STRAGGLER_ALPHA) or self.steps >= MIN_STEPS


def judge(arrivals: Arrivals, members: int) -> Lateness | None:
    """The test of a group's arrivals (module doc), among its `members` ranks; None when nobody waited."""
    k = len(arrivals.latest)
    if k == 0:
        return None
    latest = np.asarray(arrivals.latest, dtype=np.int64)
    delay = np.asarray(arrivals.delay_ns, dtype=np.float64)
    chance = float(np.mean(1.0 / np.maximum(np.asarray(arrivals.size, dtype=np.float64), 2.0)))
    ranks, at, counts = np.unique(latest, return_inverse=True, return_counts=True)
    total = float(delay.sum())
    shares = np.bincount(at, weights=delay, minlength=len(ranks)) / total
    phi = persistence(at, delay, shares)
    kish = total**2 / float(np.square(delay).sum())
    effective = kish * (1.0 - phi)
    size = max(members, len(ranks), 2)
    expected = effective / size
    never = size - len(ranks)  # members never last
    chi2 = float(np.square(shares * effective - expected).sum() + never * expected**2) / expected
    p_order = float(chi2_sf(chi2, size - 1))
    p_value: dict[int, float] = {}
    named: list[int] = []
    left, tail, stopped = 1.0, np.ones(1), False
    for j in np.argsort(-shares, kind="stable").tolist():
        if not stopped:  # (after the first rank not named, the others are read off the same tail)
            n = max(round(effective * left), 1)
            tail = binomial_tail(n, min(1.0 / max(size - len(named), 1) if named else chance, 1.0))
        x = int(np.clip(round(float(shares[j]) * effective), 0, len(tail) - 1))
        p_value[int(ranks[j])] = float(tail[x])
        if not stopped and p_order < STRAGGLER_ALPHA and tail[x] < RANK_ALPHA / size:
            named.append(int(ranks[j]))
            left -= float(shares[j])
        else:
            stopped = True
    steps, p_step = _by_step(arrivals, at, ranks, delay, size)
    if steps < MIN_STEPS:
        # (too few steps to be the units: the instances are, as many as the persistence leaves independent)
        p_step = _by_instance(at, ranks, delay, size, effective)
    for j in np.argsort(-shares, kind="stable").tolist():
        r = int(ranks[j])
        if r not in named and p_step.get(r, 1.0) < MAGNITUDE_ALPHA / size and shares[j] > MAGNITUDE_MIN_SHARE:
            named.append(r)
    return Lateness(
        instances=k,
        effective_instances=round(effective, 2),
        persistence=round(phi, 3),
        chance=chance,
        p_order=p_order,
        share={int(r): float(s) for r, s in zip(ranks.tolist(), shares.tolist(), strict=True)},
        last_at={int(r): int(c) for r, c in zip(ranks.tolist(), counts.tolist(), strict=True)},
        p_value=p_value,
        named=named,
        steps=steps,
        p_step=p_step,
    )


def _by_step(
    arrivals: Arrivals, at: np.ndarray, ranks: np.ndarray, delay: np.ndarray, size: int
) -> tuple[int, dict[int, float]]:
    """The magnitude test (module doc): per step, the delay charged to each rank less the mean charged to the
    others; under jitter its mean over the steps is 0, and a rank late by much the same amount in every step is
    late beyond it however few its instances. (steps, rank -> one-sided p of Student's t on those differences,
    df = steps - 1); no p-value with fewer than MIN_STEPS steps or a step of unknown number."""
    step = np.asarray(arrivals.step, dtype=np.int64)
    if not len(step) or (step < 0).any():
        return 0, {}
    numbers, row = np.unique(step, return_inverse=True)
    if len(numbers) < MIN_STEPS:
        return len(numbers), {}
    charged = np.zeros((len(numbers), len(ranks)))
    np.add.at(charged, (row, at), delay)
    total = charged.sum(axis=1, keepdims=True)
    diff = charged - (total - charged) / max(size - 1, 1)
    mean, sd = diff.mean(axis=0), diff.std(axis=0, ddof=1)
    out = {}
    for j, r in enumerate(ranks.tolist()):
        if mean[j] <= 0:
            out[int(r)] = 1.0
        else:
            t = math.inf if sd[j] == 0 else float(mean[j] / (sd[j] / math.sqrt(len(numbers))))
            out[int(r)] = t_sf(t, len(numbers) - 1)
    return len(numbers), out


def _by_instance(
    at: np.ndarray, ranks: np.ndarray, delay: np.ndarray, size: int, effective: float
) -> dict[int, float]:
    """The magnitude test with the instances as units, where the steps are too few (_by_step): at each instance,
    the delay charged to the rank less the mean charged to each other rank; Student's t on them with the effective
    number of instances (Kish's, times 1 - persistence) as the sample size; no p-value under MIN_STEPS of them."""
    n = len(at)
    if effective < MIN_STEPS or n < MIN_STEPS:
        return {}
    out = {}
    for j, r in enumerate(ranks.tolist()):
        mine = np.where(at == j, delay, 0.0)
        diff = mine - (delay - mine) / max(size - 1, 1)
        mean, sd = float(diff.mean()), float(diff.std(ddof=1))
        if mean <= 0:
            out[int(r)] = 1.0
            continue
        t = math.inf if sd == 0 else mean / (sd / math.sqrt(effective))
        out[int(r)] = t_sf(t, max(int(effective) - 1, 1))
    return out


def persistence(at: np.ndarray, delay: np.ndarray, shares: np.ndarray) -> float:
    """phi: how much one instance's last rank says about the next ones', as the share of the instances that
    repeat an earlier one: 1 - 1 / tau, where tau = 1 + 2 * (rho_1 + rho_2 + ...) is the integrated
    autocorrelation of the ranks' delay series (each instance's delay on the rank last at it, less the rank's
    share of it), summed over the lags up to the first that is not positive (at most MAX_LAG). rho_k is how much
    more often instances k apart have the same last rank than the shares make it by chance, each pair weighted
    by its two delays, so that a run of large delays on one rank counts as the one event it is (0 when each rank
    is last independently; near 1: one run)."""
    if len(at) < 2:
        return 0.0
    by_chance = float(np.square(shares).sum())
    if by_chance >= 1.0 - 1e-9:
        return 0.0  # one rank last at every instance: no change of order to measure
    norm = (1.0 - by_chance) * float(np.square(delay).sum())
    tau = 1.0
    for k in range(1, min(MAX_LAG, len(at) - 1) + 1):
        same = (at[k:] == at[:-k]).astype(np.float64) - by_chance
        rho = float((delay[k:] * delay[:-k] * same).sum()) / norm
        if rho <= 0:
            break
        tau += 2.0 * rho
    return float(np.clip(1.0 - 1.0 / tau, 0.0, PERSISTENCE_MAX))


def binomial_tail(n: int, p: float) -> np.ndarray:
    """P(X >= x) for x = 0..n, X ~ Binomial(n, p), in log space (n may be large)."""
    x = np.arange(n + 1, dtype=np.float64)
    steps = np.log(np.arange(n, 0, -1, dtype=np.float64)) - np.log(np.arange(1, n + 1, dtype=np.float64))
    log_choose = np.r_[0.0, np.cumsum(steps)]
    log_pmf = log_choose + x * np.log(p) + (n - x) * np.log1p(-p)
    pmf = np.exp(log_pmf - log_pmf.max())
    pmf /= pmf.sum()
    return np.minimum(np.cumsum(pmf[::-1])[::-1], 1.0)


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for X ~ chi-square with `df` degrees of freedom (the regularized upper incomplete gamma function
    Q(df / 2, x / 2), by its finite series for integer df)."""
    if x <= 0:
        return 1.0
    half = x / 2.0
    if df % 2 == 0:
        terms = [j * math.log(half) - math.lgamma(j + 1) for j in range(df // 2)]
        head = 0.0
    else:
        terms = [(j + 0.5) * math.log(half) - math.lgamma(j + 1.5) for j in range((df - 1) // 2)]
        head = math.erfc(math.sqrt(half))
    tail = sum(math.exp(t - half) for t in terms)
    return float(min(head + tail, 1.0))
