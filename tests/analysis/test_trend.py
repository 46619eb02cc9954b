"""The step-time trend of `stepscope analyze RUN`, on real jobs: none on a flat job with periodic slow steps, the
right sign and size on a job whose steps grow, nothing absurd from a short run, and a long run's trend from its
block medians."""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import stepscope
from stepscope.cli import cli

from ..support.train import make_training


def run_job(out: Path, steps: int, sleep_ms: Callable[[int], float], **options: Any) -> Path:
    """A real CPU training job whose step `i` also sleeps `sleep_ms(i)` (a sleep, not work: its length does not
    depend on the other jobs on this machine)."""
    train_step, model = make_training()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        monitor = stepscope.performance_monitor(model, out_dir=str(out), console=False, **options)

        @monitor
        def step(i: int) -> None:
            train_step()
            time.sleep(sleep_ms(i) / 1000)

        for i in range(steps):
            step(i)
        monitor.close()
    assert monitor.run_dir is not None
    return monitor.run_dir


def analyze(run_dir: Path) -> tuple[dict[str, Any], str]:
    """(the rank's step_times from --json, the terminal output)."""
    doc = CliRunner().invoke(cli, ["analyze", str(run_dir), "--json"])
    assert doc.exit_code == 0, doc.output
    text = CliRunner().invoke(cli, ["analyze", str(run_dir)], env={"COLUMNS": "200"})
    assert text.exit_code == 0, text.output
    (times,) = json.loads(doc.output)["run"]["step_times"]
    return times, text.output


def trend_cell(output: str) -> str:
    """The trend column of the run's step-time table (its last cell on rank 0's row)."""
    lines = output.splitlines()
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("rank") and "trend" in line)
    row = next(line for line in lines[header + 1 :] if line.lstrip().startswith("0 "))
    return row.split()[-1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("trend")


def test_a_flat_job_with_slow_steps_has_no_trend(runs: Path) -> None:
    # 24 steps, every 5th sleeps 30 ms (the others 2 ms): the median of the first quarter against the last
    # quarter read -43% to -51% on such a job
    run_dir = run_job(runs, 24, lambda i: 30.0 if i % 5 == 4 else 2.0)
    times, out = analyze(run_dir)
    # 18 plain steps, less those that ran beside the window's end work where enough remain (test_window_work.py)
    n = times["plain_steps"]
    assert n + times["overlapped_steps"] == 18
    assert times["trend_pct"] is None and times["trend_ms_per_step"] is None
    assert times["trend_p_value"] is not None and times["trend_p_value"] >= 0.001
    assert f"no significant trend over {n} plain steps" in times["trend_note"]
    assert trend_cell(out) == "-" and f"no significant trend over {n} plain steps" in out


def test_a_job_whose_steps_grow_has_a_trend_of_the_right_sign_and_size(runs: Path) -> None:
    # steps 1..23 sleep 2 ms + 0.5 ms per step: 11 ms more from the first plain step to the last
    run_dir = run_job(runs, 24, lambda i: 2.0 + 0.5 * i)
    times, out = analyze(run_dir)
    slope, pct, median = times["trend_ms_per_step"], times["trend_pct"], times["median_ms"]
    assert 0.4 < slope < 0.65, slope
    assert times["trend_p_value"] < 0.001
    assert pct == pytest.approx(100 * slope * 22 / median)  # the change over steps 1-23, in % of the median
    assert 80 < pct < 200, pct
    assert trend_cell(out) == f"{pct:+.0f}%"
    n = times["plain_steps"]
    assert n + times["overlapped_steps"] == 18
    assert f"trend {pct:+.0f}% of the median step" in out and f"over {n} plain steps (1-" in out


def test_a_short_run_prints_no_trend(runs: Path) -> None:
    # 15 steps (9 plain ones): the old trend compared medians of two steps and printed +2272.2%
    run_dir = run_job(runs, 15, lambda i: 30.0 if i % 5 == 4 else 0.0)
    times, out = analyze(run_dir)
    assert times["plain_steps"] == 9
    assert times["trend_pct"] is None and times["trend_p_value"] is None
    assert times["trend_note"] == "no trend: 9 plain steps, 12 needed"
    assert trend_cell(out) == "-" and "no trend: 9 plain steps, 12 needed" in out


@pytest.mark.slow
def test_a_long_runs_trend_is_measured_on_block_medians(runs: Path) -> None:
    # 400 steps, no profiler window: more than the 256 points the pairwise tests look at. The job runs once more
    # when its slope misses: on 2 busy cores, other work landing on the later steps of one run steepens it (a full
    # suite's run measured 0.0142 ms per step); both runs' slopes are kept.
    slopes = []
    for attempt in range(2):
        run_dir = run_job(runs / f"attempt{attempt}", 400, lambda i: 0.5 + 0.01 * i, wait=1000)
        times, _ = analyze(run_dir)
        assert times["plain_steps"] == 399
        assert times["trend_p_value"] < 0.001 and times["trend_pct"] > 0
        slopes.append(times["trend_ms_per_step"])
        if 0.007 < slopes[-1] < 0.014:
            return
    pytest.fail(f"the slope of each run (0.01 ms per step injected), outside 0.007-0.014: {slopes}")
