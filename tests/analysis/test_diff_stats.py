"""The statistics of `stepscope diff`: the shift between two runs' step times and its 95% interval (a rank test),
the steps it names, and how findings of two runs are matched."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from stepscope.analysis.diff._shift import critical_rank, quantile_shift, shift
from stepscope.analysis.diff.compare import match_findings
from stepscope.analysis.diff.steps import step_ranges

MAX_N = 40


def exact_critical_ranks(most: int) -> dict[tuple[int, int], int]:
    """K of the exact Mann-Whitney distribution for every n, m up to `most`: the largest u with
    P(U <= u) <= 2.5% (-1 when there is none), from the counts of U over all orderings of n + m values."""
    counts: dict[tuple[int, int], np.ndarray] = {}
    for n in range(most + 1):
        for m in range(most + 1):
            if n == 0 or m == 0:
                counts[n, m] = np.array([1.0])
                continue
            # the largest value belongs to the first sample (it beats all m others) or to the second
            first, second = counts[n - 1, m], counts[n, m - 1]
            c = np.zeros(n * m + 1)
            c[m : m + len(first)] += first
            c[: len(second)] += second
            counts[n, m] = c
    out = {}
    for (n, m), c in counts.items():
        if n >= 2 and m >= 2:
            below = np.flatnonzero(np.cumsum(c) / c.sum() <= 0.025)
            out[n, m] = int(below[-1]) if len(below) else -1
    return out


def test_the_interval_is_never_narrower_than_the_exact_rank_test() -> None:
    exact = exact_critical_ranks(MAX_N)
    ours = {(n, m): critical_rank(n, m) for n, m in exact}
    assert all(ours[key] <= exact[key] for key in exact), [k for k in exact if ours[k] > exact[k]]
    assert max(exact[key] - ours[key] for key in exact) <= 1


def test_identical_runs_are_called_different_at_most_one_time_in_twenty() -> None:
    # GIVEN 2000 pairs of runs drawn from one skewed step-time distribution with slow outliers (seeded)
    rng = np.random.default_rng(1)

    def run() -> np.ndarray:
        steps = rng.lognormal(np.log(0.5), 0.1, 30)
        slow = rng.random(30) < 0.15
        return steps + slow * rng.exponential(5.0, 30)

    significant = [shift(run(), run()).significant for _ in range(2000)]
    # THEN about 5% are significant, as a 95% interval promises (0.5% is one standard error of 2000 pairs)
    assert sum(significant) / len(significant) <= 0.06


def test_a_slowdown_of_a_fifth_is_found_in_thirty_steps() -> None:
    rng = np.random.default_rng(5)
    found = []
    for _ in range(200):
        base = rng.lognormal(np.log(0.5), 0.1, 30)
        test = rng.lognormal(np.log(0.6), 0.1, 30)
        s = shift(base, test)
        found.append(s.significant and s.low is not None and s.low > 0)
    assert sum(found) / len(found) >= 0.95


def test_the_shift_is_the_median_of_the_differences_within_its_interval() -> None:
    s = shift([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], [11.0, 12.0, 13.0, 14.0, 15.0, 16.0, 17.0, 18.0])
    assert s.estimate == 10.0 and s.low is not None and s.high is not None
    assert 0 < s.low <= 10.0 <= s.high and s.significant
    assert (s.base_n, s.test_n) == (8, 8)


def test_three_steps_a_side_cannot_show_a_change() -> None:
    # fully separated, yet 3 and 3 values are too few for any rank test to reject at 5%
    s = shift([1.0, 1.1, 1.2], [5.0, 5.1, 5.2])
    assert (s.estimate, s.low, s.high, s.significant) == (pytest.approx(4.0), None, None, False)


def test_equal_runs_have_no_change() -> None:
    s = shift([2.0] * 10, [2.0] * 12)
    assert (s.estimate, s.low, s.high, s.significant) == (0.0, 0.0, 0.0, False)


def test_an_empty_side_has_no_shift() -> None:
    assert shift([], [1.0, 2.0]).estimate is None


def test_long_runs_are_thinned_to_bound_the_work() -> None:
    base = np.linspace(1.0, 2.0, 20_000)
    s = shift(base, base + 0.5)
    assert s.estimate == pytest.approx(0.5, abs=1e-3) and s.significant
    assert (s.base_n, s.test_n) == (20_000, 20_000)


@pytest.mark.parametrize(
    ("steps", "text"),
    [([], ""), ([3], "3"), ([1, 2, 3, 4, 10, 11, 12], "1-4, 10-12"), ([7, 5, 6, 9], "5-7, 9")],
)
def test_step_ranges(steps: list[int], text: str) -> None:
    assert step_ranges(steps) == text


def finding(id_: str, rank: int | None, ranks: list[int] | None = None) -> Any:
    return SimpleNamespace(id=id_, rank=rank, ranks=ranks)


def test_findings_match_by_id_and_rank() -> None:
    base = [finding("comm_bound", 0), finding("comm_bound", 1), finding("straggler", None)]
    test = [finding("comm_bound", 1), finding("data_loader_stall", 0), finding("straggler", None)]
    pairs = [
        (b and (b.id, b.rank), t and (t.id, t.rank))  # type: ignore[truthy-bool]
        for b, t in match_findings(base, test)
    ]
    assert pairs == [
        (("comm_bound", 0), None),
        (("comm_bound", 1), ("comm_bound", 1)),
        (("straggler", None), ("straggler", None)),
        (None, ("data_loader_stall", 0)),
    ]


def test_findings_grouped_over_ranks_match_when_their_ranks_overlap() -> None:
    # GIVEN findings that name the ranks they hold on, the costliest as `rank`
    base = [finding("comm_bound", 2, [0, 1, 2, 3]), finding("straggler", 3, [3])]
    test = [finding("comm_bound", 0, [0, 1]), finding("comm_bound", 3, [3]), finding("straggler", 1, [1])]
    pairs = [(b and b.rank, t and t.rank) for b, t in match_findings(base, test)]  # type: ignore[truthy-bool]
    # THEN the group matches the test finding sharing most ranks; a straggler on another rank is another finding
    assert pairs == [(2, 0), (3, None), (None, 3), (None, 1)]


def test_a_quantile_shift_has_an_interval_from_twenty_values_a_side() -> None:
    base = np.linspace(1.0, 2.0, 50)
    s = quantile_shift(base, base + 0.5, 0.1)
    assert s.estimate == pytest.approx(0.5) and s.low is not None and s.high is not None
    assert s.low <= 0.5 <= s.high and s.significant
    few = quantile_shift(base[:19], base[:19] + 0.5, 0.1)
    assert few.estimate == pytest.approx(0.5) and (few.low, few.high, few.significant) == (None, None, False)


def runs_of(base: np.ndarray, test: np.ndarray) -> tuple[Any, Any]:
    """Two runs as `diff_tables` reads them: plain steps 1..n of rank 0 (metrics.jsonl's lines), no notes."""
    from stepscope.runfolder.payloads import StepMetrics

    def run(times: np.ndarray) -> Any:
        lines = [StepMetrics(step=i + 1, rank=0, wall_ms=float(t), phase="none") for i, t in enumerate(times)]
        return SimpleNamespace(metrics=lines, notes=[])

    return run(base), run(test)


def step_time_gate(base: np.ndarray, test: np.ndarray, tmp: Any) -> Any:
    from stepscope.analysis.diff.compare import diff_tables
    from stepscope.analysis.diff.gates import evaluate_gates
    from stepscope.analysis.read.loader import load_trace

    from ..support.traces import step, trace, write

    table = load_trace(write(tmp / "t.json", trace([step(1, 0, 500), step(2, 500, 500)])))
    base_run, test_run = runs_of(base, test)
    diff = diff_tables(table, table, base_run=base_run, test_run=test_run)
    (gate,) = evaluate_gates(diff, ["step_time>+5%"])
    return diff, gate


def test_a_busier_machine_is_not_a_slower_step(tmp_path: Any) -> None:
    # GIVEN two runs with the same fast steps, the test run's machine busier: 70% of its steps delayed, by 0.2 ms
    # on average (as measured on the 2-core machine: the 10th percentile within 5%, the median 15% slower)
    rng = np.random.default_rng(7)
    base = rng.normal(0.50, 0.01, 150)
    test = rng.normal(0.50, 0.01, 150) + (rng.random(150) < 0.7) * rng.exponential(0.2, 150)
    diff, gate = step_time_gate(base, test, tmp_path)
    # THEN the median moved significantly by more than 5%, the fast steps did not: no breach, and why
    assert diff.step_time.significant and diff.step_time.low_ms > 0.025
    assert not gate.breached and "fast steps (10th percentile) moved" in gate.reason


def test_a_slower_step_breaches(tmp_path: Any) -> None:
    # GIVEN every step of the test run 10% slower
    rng = np.random.default_rng(8)
    base = rng.normal(0.50, 0.01, 150)
    test = rng.normal(0.55, 0.01, 150)
    diff, gate = step_time_gate(base, test, tmp_path)
    assert gate.breached and gate.reason.endswith("beyond +5%")
    assert diff.step_time.base.source == "plain" and diff.step_time.base.steps == list(range(1, 151))
