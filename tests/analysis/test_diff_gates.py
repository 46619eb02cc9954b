"""`stepscope diff --fail-on` judged rank by rank, with three outcomes (issue 42, items 4 and 5): a regression on
one rank of several breaches and names that rank; a few steps that cannot bound the change are decided by an
exact rank test where their separation allows it, else the gate is undecided (exit 4), never a silent pass."""

from __future__ import annotations

import itertools
import json
import re
from math import comb
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stepscope.analysis.diff._shift import beyond_p
from stepscope.cli import main

from ..support.traces import cpu, step, write_trace


def job(folder: Path, loader_ms: dict[int, list[float]], step_ms: float = 10.0) -> Path:
    """A CPU job of len(loader_ms) ranks, one trace each: step i of rank r waits loader_ms[r][i] on the DataLoader,
    then runs forward (3 ms) and backward for the rest of `step_ms` (the step grows with its loader)."""
    for rank, loads in loader_ms.items():
        events, t0 = [], 0.0
        for i, lo_ms in enumerate(loads):
            lo, total = lo_ms * 1e3, (step_ms + lo_ms) * 1e3
            if lo:
                events.append(cpu("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t0, lo))
            events += [
                step(i, t0, total),
                cpu("forward", t0 + lo, 3000, cat="user_annotation"),
                cpu("aten::mm", t0 + lo, 3000),
                cpu("backward", t0 + lo + 3000, total - lo - 3000, cat="user_annotation"),
                cpu("aten::mm", t0 + lo + 3000, total - lo - 3000),
            ]
            t0 += total
        write_trace(folder / f"rank{rank}.json", events, rank, world_size=len(loader_ms))
    return folder


def run_diff(
    capsys: pytest.CaptureFixture[str], base: Path, test: Path, *gates: str
) -> tuple[int, dict[str, Any], str]:
    """Exit status, the --json document and stderr of `stepscope diff BASE TEST --fail-on ...`."""
    flags = [x for g in gates for x in ("--fail-on", g)]
    code = main(["diff", str(base), str(test), *flags, "--json"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out), captured.err


def test_the_exact_test_counts_every_ordering() -> None:
    # the null distribution against brute force: every way of ordering n base and m test values
    from stepscope.analysis.diff._shift import _u_counts

    for n, m in itertools.product(range(1, 6), repeat=2):
        brute = np.zeros(n * m + 1)
        for base in itertools.combinations(range(n + m), n):
            test = [k for k in range(n + m) if k not in base]
            brute[sum(t > b for t in test for b in base)] += 1
        assert (_u_counts(n, m) == brute).all() and brute.sum() == comb(n + m, n)
    # 3 against 3, every test value beyond: 1 ordering of 20
    assert beyond_p([1.0, 1.1, 1.2], [5.0, 5.1, 5.2], 0.0) == pytest.approx(0.05)
    # ... but not beyond an offset that makes them overlap, and ties count against
    assert beyond_p([1.0, 1.1, 1.2], [5.0, 5.1, 5.2], 3.95) > 0.05
    assert beyond_p([1.0, 1.0, 1.0], [1.0, 1.0, 1.0], 0.0) == 1.0


def test_the_exact_test_holds_its_level_under_no_change() -> None:
    # 4 against 4 from one distribution, 4,000 times: "beyond" at 5% no more often than 5%
    rng = np.random.default_rng(3)
    rejected = [beyond_p(rng.normal(size=4), rng.normal(size=4), 0.0) <= 0.05 for _ in range(4000)]
    assert np.mean(rejected) <= 0.05


def test_a_regression_on_one_rank_of_two_breaches_and_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN 2 ranks, 3 profiled steps each; rank 1's loader goes from <1 ms to 48 ms, rank 0's stays
    base = job(tmp_path / "base", {0: [0.6, 0.5, 0.7], 1: [0.5, 0.8, 0.6]})
    test = job(tmp_path / "test", {0: [0.7, 0.6, 0.5], 1: [48.0, 48.3, 47.9]})
    # WHEN gated on the data loader
    code, doc, err = run_diff(capsys, base, test, "data_loader>+5ms")
    # THEN the gate breaches on rank 1, by the exact rank test (3 and 3 values bound no interval)
    assert code == 3, err
    (gate,) = doc["gates"]
    assert (gate["outcome"], gate["breached"], gate["rank"], gate["ranks"]) == ("breach", True, 1, [1])
    assert "rank 1: data loader" in gate["reason"] and "exact rank test, one-sided p = 0.05" in gate["reason"]
    assert "--fail-on data_loader>+5ms breached: rank 1:" in err
    # the pooled phase does not speak for the ranks: each has its row
    loader = next(p for p in doc["phases"] if p["name"] == "data_loader")
    assert loader["ranks_agree"] is False
    by_rank = {r["rank"]: r for r in loader["by_rank"]}
    assert by_rank[1]["delta_ms"] == pytest.approx(47.4, abs=0.5) and abs(by_rank[0]["delta_ms"]) < 0.3
    # and the terminal shows the ranks under the phase, the gate's result names the rank
    assert main(["diff", str(base), str(test), "--fail-on", "data_loader>+5ms", "--wide"]) == 3
    out = re.sub(r"\s+", " ", capsys.readouterr().out)
    assert "data loader │ 600 us │ 24.3 ms │ +23.6 ms" in out
    assert "rank 1 │ 600 us │ 48.0 ms │ +47.4 ms │ 80x │ too few" in out, out
    # the finding on rank 1 is judged by rank 1's loader, not by the ranks pooled
    assert "changed rank 1 data_loader_stall: MEDIUM -> HIGH, 600 us -> 48.0 ms per step The" in out
    # (the gate's row gives the figures of the rank it judged: rank 1's loader, 600 us -> 48.0 ms)
    assert "data_loader>+5ms │ 600 us │ 48.0 ms │ 80x │ BREACHED rank 1" in out, out
    assert (gate["base"], gate["test"]) == (pytest.approx(0.6), pytest.approx(48.0))
    # the other way round, each rank's change is within the gate by the same test: a pass
    code, doc, err = run_diff(capsys, test, base, "data_loader>+5ms")
    assert code == 0 and doc["gates"][0]["outcome"] == "pass", err


def test_ranks_that_agree_are_pooled(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN 4 ranks whose loaders all grow by 10 ms, 3 steps each: 12 values a side bound an interval pooled
    rng = np.random.default_rng(0)
    base = job(tmp_path / "base", {r: list(1.0 + rng.random(3) * 0.2) for r in range(4)})
    test = job(tmp_path / "test", {r: list(11.0 + rng.random(3) * 0.2) for r in range(4)})
    code, doc, _ = run_diff(capsys, base, test, "data_loader>+5ms")
    (gate,) = doc["gates"]
    loader = next(p for p in doc["phases"] if p["name"] == "data_loader")
    assert loader["ranks_agree"] is True and len(loader["by_rank"]) == 4
    assert code == 3 and gate["reason"].startswith("ranks 0-3 pooled (their changes agree)")
    assert gate["low_ms"] > 5.0 and gate["rank"] is None


def test_three_steps_a_side_that_overlap_are_undecided(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN one rank, 3 profiled steps a side, the loader +4 ms but the steps overlap around the 5 ms threshold
    base = job(tmp_path / "base", {0: [1.0, 2.0, 7.0]})
    test = job(tmp_path / "test", {0: [5.0, 6.0, 9.0]})
    code, doc, err = run_diff(capsys, base, test, "data_loader>+5ms")
    (gate,) = doc["gates"]
    # THEN neither a breach nor a pass can be shown: undecided, exit 4, with the reason on stderr
    assert (code, gate["outcome"], gate["breached"]) == (4, "undecided", False)
    assert "3 and 3 values overlap too much for an exact rank test to decide" in gate["reason"]
    assert "--fail-on data_loader>+5ms undecided:" in err


def test_a_five_fold_slower_step_in_three_profiled_steps_breaches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN traces of 3 profiled steps each (no plain steps): 20 ms steps, then 100 ms ones
    base = job(tmp_path / "base", {0: [0.5, 0.6, 0.4]}, step_ms=20.0)
    test = job(tmp_path / "test", {0: [80.0, 81.0, 79.0]}, step_ms=20.0)
    code, doc, err = run_diff(capsys, base, test, "step_time>+5%")
    # THEN the step time gate breaches: every test step is slower than every base step by more than 5%
    (gate,) = doc["gates"]
    assert (code, gate["outcome"]) == (3, "breach"), err
    assert doc["step_time"]["low_ms"] is None  # no interval: the exact test decided
    # identical runs pass the same gate only if their steps show it: 3 equal steps a side are within 5%
    code, doc, err = run_diff(capsys, base, base, "step_time>+5%")
    assert (code, doc["gates"][0]["outcome"]) == (0, "pass"), err


def test_a_metric_neither_run_shows_passes_and_one_only_one_shows_is_undecided(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = job(tmp_path / "base", {0: [0.0] * 8})
    test = job(tmp_path / "test", {0: [3.0] * 8})
    # neither run shows GPU idle: nothing to compare, a pass that says so
    code, doc, _ = run_diff(capsys, base, test, "gpu_idle>+10%")
    assert code == 0 and doc["gates"][0]["reason"].startswith("neither run shows GPU idle")
    # only the test run shows a data loader: that cannot be compared, and the gate does not pass in silence
    code, doc, err = run_diff(capsys, base, test, "data_loader>+1ms")
    assert (code, doc["gates"][0]["outcome"]) == (4, "undecided")
    assert "the base run does not show data loader" in err


@pytest.mark.slow
def test_real_ddp_jobs_gate_per_rank_and_never_pass_blind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ..support.jobs import run_ddp_job as run_job

    def run_ddp_job(out: Path, **options: Any) -> Path:
        out.mkdir()
        return run_job(out, **options)

    # GIVEN 2-rank gloo DDP jobs (every rank traced), one whose rank 1 loader sleeps 48 ms a batch
    base = run_ddp_job(tmp_path / "a", nproc=2, slow_rank=1, delay_ms=0.0)
    slow = run_ddp_job(tmp_path / "slow", nproc=2, slow_rank=1, delay_ms=48.0)
    # THEN the loader gate breaches, naming rank 1 (the pooled loader of both ranks moves half as much)
    code, doc, err = run_diff(capsys, base, slow, "data_loader>+5ms", "step_time>+5%")
    loader_gate, step_gate = doc["gates"]
    assert code == 3 and loader_gate["outcome"] == "breach" and loader_gate["rank"] == 1, err
    assert step_gate["outcome"] == "breach"
    # the other way round: a speed-up breaches nothing
    code, doc, err = run_diff(capsys, slow, base, "data_loader>+5ms", "step_time>+5%")
    assert code == 0 and [g["outcome"] for g in doc["gates"]] == ["pass", "pass"], err
    # (runs alike pass: test_diff_reruns.py)
    # GIVEN 6-step runs, the test run's loader stalling 80 ms on its one rank: 5x slower steps
    window = ["--wait", "1", "--warmup", "1", "--active", "3"]  # 3 profiled steps, no 8 plain ones
    short = run_ddp_job(tmp_path / "short", nproc=1, slow_rank=0, delay_ms=0.0, steps=6, run_options=window)
    stalled = run_ddp_job(
        tmp_path / "stalled", nproc=1, slow_rank=0, delay_ms=80.0, steps=6, run_options=window
    )
    code, doc, err = run_diff(capsys, short, stalled, "step_time>+5%")
    # THEN the step time gate breaches or is undecided, never a pass
    assert code in (3, 4) and doc["gates"][0]["outcome"] in ("breach", "undecided"), err
