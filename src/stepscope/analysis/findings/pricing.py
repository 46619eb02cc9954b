"""What a finding costs, step by step: the `Finding` record, its severity, and its price from the cost in each
step of the window.

A finding's cost is measured in every step of the window (the window split at the steps' starts, so the steps
cover it exactly) and priced by the median step, so that one slow or preempted step cannot make a finding HIGH. A
finding holds in a step when that step's cost reaches the rule's threshold; one that holds in at most half of the
steps is occasional: reported (LOW) only when its cost over the whole window reaches the threshold too, its
message giving the cost in the steps where it holds and saying in how many (docs/analysis.md, "Findings").
"""

from __future__ import annotations

from functools import cached_property

import msgspec
import numpy as np

from stepscope.analysis import intervals as iv
from stepscope.analysis.per_rank.prepare import RankData, RankDigest
from stepscope.analysis.stats import median
from stepscope.units import fmt_ms, fmt_pct

# Severity by the share of the step a finding costs; below FINDING_MIN_PCT a finding is not reported.
SEVERITY_PCT = (("high", 20.0), ("medium", 5.0), ("low", 1.0))
FINDING_MIN_PCT = 1.0
FINDING_MIN_NS_PER_STEP = 10_000  # and under 10 us per step
# per-step costs listed in full in the arithmetic up to this many steps (min / median / max beyond)
ARITHMETIC_MAX_STEPS = 8

Evidence = dict[str, float | int | str | None]


class Finding(msgspec.Struct):
    """One piece of advice: what, how bad, which rank, one sentence, its price and the numbers behind it.

    A finding that holds on several ranks at a similar cost is one finding: `rank` is the costliest of them (its
    message and evidence are that rank's), `ranks` all of them, `cost_range_ms_per_step` the cheapest and the
    costliest rank's cost."""

    id: str
    severity: str  # "high" | "medium" | "low" | "info"
    rank: int | None
    message: str  # what happens, who is responsible (region / op / kernel / rank) and the action
    evidence: Evidence  # the figures, with "arithmetic": how the price was reached
    cost_ms_per_step: float | None = None  # what fixing it would save per step; null for info
    pct_of_step: float | None = None  # the same, % of the median step time
    action: str = ""  # the one concrete thing to do
    steps_held: int | None = None  # in how many of the window's steps it holds (null: not judged per step)
    steps: int | None = None  # the window's steps
    ranks: list[int] = []  # every rank where it holds, `rank` among them; empty when it is about no rank
    cost_range_ms_per_step: list[float] | None = None  # [cheapest, costliest] over `ranks`; null for one rank
    # what fixing it saves per step, by which findings are ranked: from a replay of the rank's steps with its work
    # removed (saving_from "replay", the what-if in `whatif`), else the rule's price (saving_from "rule");
    # null for info. `saving_note`: how the figure was reached, or why no replay prices it (findings/replayed.py)
    saving_ms_per_step: float | None = None
    saving_from: str | None = None  # "replay" | "rule"; null for info
    whatif: list[
        str
    ] = []  # the --scale selectors of `stepscope whatif` that remove it, where selectors name it
    saving_note: str = ""


def _median(values: np.ndarray) -> float:
    return median(values.tolist()) if len(values) else 0.0


def severity_of(pct_of_step: float) -> str | None:
    """The severity for a cost of `pct_of_step` % of the step; None below FINDING_MIN_PCT."""
    for name, floor in SEVERITY_PCT:
        if pct_of_step >= floor:
            return name
    return None


# Records of arrays: compared and printed by identity (a field-wise == of arrays raises, and their repr
# would print the arrays); generating __eq__ and __repr__ cost ~0.15 ms of every start.
class WindowSteps(msgspec.Struct, eq=False, frozen=True):
    """The window of a rank cut into its steps: each from its start to the next step's start (the last to the
    window's end); without ProfilerSteps, the window is one step."""

    start: np.ndarray
    end: np.ndarray

    @staticmethod
    def of(data: RankData | RankDigest) -> WindowSteps:
        starts = np.asarray(data.steps.start, dtype=np.int64)
        if len(starts) == 0 or data.hi <= data.lo:
            return WindowSteps(
                np.array([data.lo], dtype=np.int64), np.array([max(data.hi, data.lo)], np.int64)
            )
        start = np.clip(starts, data.lo, data.hi)
        return WindowSteps(start, np.r_[start[1:], np.int64(data.hi)].astype(np.int64))

    def __len__(self) -> int:
        return len(self.start)

    @property
    def length(self) -> np.ndarray:
        return self.end - self.start

    def covered(self, intervals: iv.Intervals) -> np.ndarray:
        """Per step, how much of the disjoint `intervals` lies in it."""
        return iv.covered_within(intervals, self.start, self.end)

    def binned(self, at: np.ndarray, values: np.ndarray) -> np.ndarray:
        """Per step, the sum of `values` placed at times `at` (before the window: the first step; after: the last)."""
        which = np.clip(np.searchsorted(self.start, at, side="right") - 1, 0, len(self) - 1)
        return np.bincount(which, weights=values, minlength=len(self)).astype(np.int64)


class Price(msgspec.Struct, eq=False, frozen=True, dict=True):  # (dict: for `held`, a cached_property)
    """A cost measured in each step of a window, and the rule's threshold (a share of the step) at which the
    finding holds in a step."""

    cost_ns: np.ndarray  # per step
    window: WindowSteps
    min_pct: float = FINDING_MIN_PCT

    @property
    def step_ns(self) -> np.ndarray:
        return self.window.length

    @property
    def steps(self) -> int:
        return len(self.step_ns)

    @cached_property
    def held(self) -> np.ndarray:
        """The steps in which the finding holds."""
        return (
            (self.cost_ns > 0)
            & (self.cost_ns * 100.0 >= self.min_pct * self.step_ns)
            & (self.cost_ns >= FINDING_MIN_NS_PER_STEP)
        )

    @property
    def steps_held(self) -> int:
        return int(self.held.sum())

    @property
    def occasional(self) -> bool:
        """It holds in some steps, but not in most: the median step does not have it."""
        return self.steps_held > 0 and 2 * self.steps_held <= self.steps

    @property
    def step_median_ns(self) -> float:
        return float(_median(self.step_ns))

    @property
    def cost_ms(self) -> float:
        """The price: the median step's cost."""
        return _median(self.cost_ns) / 1e6

    @property
    def cost_pct(self) -> float:
        step = self.step_median_ns
        return 100.0 * _median(self.cost_ns) / step if step > 0 else 0.0

    @property
    def ms(self) -> float:
        """The cost per step a message states: the median step's; an occasional finding's, the median of the
        steps in which it holds."""
        if self.occasional:
            return _median(self.cost_ns[self.held]) / 1e6
        return self.cost_ms

    @property
    def pct(self) -> float:
        """`ms` as a share of the step (of the steps in which it holds, for an occasional finding)."""
        if self.occasional:
            held = self.held
            return _median(100.0 * self.cost_ns[held] / np.maximum(self.step_ns[held], 1))
        return self.cost_pct

    def median_ms(self, intervals: iv.Intervals) -> float:
        """The time of `intervals` per step, in ms, over the steps the message speaks of (its other figures):
        the median step; for an occasional finding, the median of the steps in which it holds."""
        per_step = self.window.covered(intervals)
        return round(_median(per_step[self.held] if self.occasional else per_step) / 1e6, 3)

    @property
    def severity(self) -> str | None:
        """None: not reported (it holds in no step; occasional, it costs the whole window too little)."""
        if self.steps_held == 0:
            return None
        if self.occasional:
            # only when it reaches the rule's threshold over the whole window, as an average: one step's noise
            # (a preempted process, a page fault) reaches it only when it is large
            total, window = float(np.sum(self.cost_ns)), float(np.sum(self.step_ns))
            enough = total >= FINDING_MIN_NS_PER_STEP * self.steps and 100.0 * total >= self.min_pct * window
            return "low" if enough else None
        return severity_of(self.cost_pct) or "low"

    def arithmetic(self, what: str) -> str:
        n, k = self.steps, self.steps_held
        costs = self.cost_ns / 1e6
        if n <= ARITHMETIC_MAX_STEPS:
            listed = ", ".join(f"{c:.3f}" for c in costs) + " ms"
        else:
            listed = f"{costs.min():.3f} (min) / {_median(costs):.3f} (median) / {costs.max():.3f} (max) ms"
        held = f"at least {self.min_pct:g}% of the step in {k} of {n} step(s)"
        if self.occasional:
            held += " only, so LOW"
        return (
            f"{what}, per step: {listed}; {held}; median {self.cost_ms:.3f} ms per step; "
            f"{self.cost_ms:.3f} / {self.step_median_ns / 1e6:.3f} ms median step = {self.cost_pct:.1f}%"
        )

    def when(self) -> str:
        """The clause of the message saying in how many steps it holds ("" in every step)."""
        n, k = self.steps, self.steps_held
        if k == n:
            return ""
        if self.occasional:
            return f", in {k} of {n} steps only (the median step: {fmt_ms(self.cost_ms)}, {fmt_pct(self.cost_pct)})"
        return f", in {k} of {n} steps"


def price_of(data: RankData | RankDigest, cost: iv.Intervals, *, min_pct: float = FINDING_MIN_PCT) -> Price:
    """The price of `cost` (disjoint intervals) in each step of the rank's window."""
    steps = WindowSteps.of(data)
    return Price(steps.covered(cost), steps, min_pct)


def price_per_step(
    data: RankData | RankDigest, at: np.ndarray, cost_ns: np.ndarray, *, min_pct: float = FINDING_MIN_PCT
) -> Price:
    """The price of costs `cost_ns` that happen at times `at`, each charged to its step (never more than the
    step)."""
    steps = WindowSteps.of(data)
    return Price(np.minimum(steps.binned(at, cost_ns), steps.length), steps, min_pct)


def priced(
    id_: str,
    rank: int | None,
    price: Price,
    what: str,
    message: str,
    action: str,
    evidence: Evidence,
) -> Finding | None:
    """A finding costing `price`, or None when it holds in no step (or, occasional, costs too little)."""
    severity = price.severity
    if severity is None:
        return None
    return Finding(
        id_,
        severity,
        rank,
        f"{message}{price.when()}; {action}.",
        {**evidence, "arithmetic": price.arithmetic(what)},
        cost_ms_per_step=round(price.cost_ms, 3),
        pct_of_step=round(price.cost_pct, 2),
        action=action,
        steps_held=price.steps_held,
        steps=price.steps,
    )
