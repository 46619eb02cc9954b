"""The watch in a monitor (config watch=True, capture/window/auto.py): a job whose steps turn slow gets a window
by itself that records slow steps, slowness that recurs is recorded from its first step, the budgets hold, every
decision is a line of watch/rank0.jsonl, and a failing watch never touches training.

The jobs here sleep for their steps (4 ms, a slow step 50 ms more): a sleep leaves the machine's cores to
whatever else runs, so the steps' own noise is the OS's."""

from __future__ import annotations

import random
import time
import warnings
from pathlib import Path
from typing import Any

import msgspec
import pytest

import stepscope
from stepscope.capture.console import StepscopeWarning
from stepscope.cli import main
from stepscope.errors import ConfigError
from stepscope.runfolder import read_manifest
from stepscope.runfolder.payloads import WatchRecord

from ..support.windows import recorded_windows

STEP_S = 0.004
SLOW_S = 0.05
POLL = 10  # trigger_poll_steps' default: the watch checks every POLL steps


def run_job(out: Path, slow: set[int], steps: int, **options: Any) -> Path:
    """A job of `steps` steps of STEP_S, those in `slow` SLOW_S longer, under a watching monitor."""
    monitor = stepscope.performance_monitor(
        out_dir=str(out), watch=True, console=False, report=False, **options
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (a rank that reads a claim late says so)
        with monitor:
            for step in range(steps):
                time.sleep(STEP_S + (SLOW_S if step in slow else 0.0))
                monitor.step()
    assert monitor.run_dir is not None
    return monitor.run_dir


def records(run_dir: Path) -> list[WatchRecord]:
    path = run_dir / "watch" / "rank0.jsonl"
    if not path.exists():
        return []
    return [msgspec.json.decode(line, type=WatchRecord) for line in path.read_bytes().splitlines()]


def windows(run_dir: Path) -> list[list[int]]:
    """Each window's active steps, from metrics.jsonl's phases."""
    return recorded_windows(run_dir).get(0, [])


def traced_windows(run_dir: Path) -> list[int]:
    return sorted(a.step for a in read_manifest(run_dir).of_kind("trace") if a.step is not None)


def with_one_retry(attempt: Any) -> Any:
    """A job on a machine shared with other work can lose its case to the machine (a stall of its own that
    the watch rightly takes for slowness): `attempt()` returns None when its case did not happen as described,
    and is run once more then."""
    result = attempt()
    return attempt() if result is None else result


@pytest.mark.parametrize("seed", [1, 2])
def test_five_slow_steps_get_a_window_that_records_one_of_them(tmp_path: Path, seed: int) -> None:
    first = random.Random(seed).randint(100, 200)
    slow = set(range(first, first + 5))
    run_dir = run_job(tmp_path, slow, first + 40)

    found = records(run_dir)
    decided = [r for r in found if r.decision == "window"]
    assert len(decided) == 1, found
    record = decided[0]
    assert record.rank == 0 and record.first == first and record.factor is not None and record.factor > 5
    assert record.window is not None and record.window[0] <= first + 2 * POLL
    # the window it asked for recorded slow steps (its steps' phases say so in metrics.jsonl), and its trace
    anomaly_window = [w for w in windows(run_dir) if w[0] > 10]
    assert anomaly_window == [list(range(record.window[0], record.window[1] + 1))]
    assert set(anomaly_window[0]) & slow
    assert record.window[1] in traced_windows(run_dir)
    # the manifest says what the watch saw and did, and indexes the records
    (note,) = [n for n in read_manifest(run_dir).notes if n.startswith("watch:")]
    assert f"rank 0 at step {record.step}" in note and f"records steps {record.window[0]}" in note
    assert [a.path for a in read_manifest(run_dir).of_kind("watch")] == ["watch/rank0.jsonl"]


def test_slow_steps_that_recur_get_a_window_from_a_slow_step(tmp_path: Path) -> None:
    every = 40
    slow = set(range(every, 480, every))
    run_dir = run_job(tmp_path, slow, 480)

    planned = [r for r in records(run_dir) if r.decision == "planned"]
    assert planned, records(run_dir)
    assert "every 40 steps" in planned[0].why
    window = planned[0].window
    assert window is not None and window[0] in slow  # its first recorded step is the slow one
    assert [w for w in windows(run_dir) if w[0] == window[0]] == [list(range(window[0], window[1] + 1))]


def test_a_steady_job_opens_no_window(tmp_path: Path) -> None:
    def attempt() -> Path | None:
        run_dir = run_job(tmp_path, set(), 500)
        found = records(run_dir)
        assert all(r.decision != "reference" for r in found)  # (the scheduled window is the reference)
        return run_dir if not found else None

    run_dir = with_one_retry(attempt)
    assert run_dir is not None, "two steady jobs in a row each had an anomaly"
    assert traced_windows(run_dir) == [9]  # the scheduled window alone (wait 5, warmup 2, active 3)


def test_an_on_demand_run_records_a_reference_window_before_the_anomaly(tmp_path: Path) -> None:
    slow = set(range(150, 155))
    run_dir = run_job(tmp_path, slow, 200, on_demand=True)
    found = records(run_dir)
    assert [r.decision for r in found][:1] == ["reference"]
    reference = found[0].window
    assert reference is not None and reference[1] < 150
    decided = [r for r in found if r.decision == "window"]
    assert decided and decided[0].window is not None
    assert traced_windows(run_dir) == [reference[1], decided[0].window[1]]


def test_the_budgets_skip_windows_and_say_why(tmp_path: Path) -> None:
    # GIVEN three bursts of slow steps: the second within the cool-down of the first window, the third after it
    bursts = (100, 140, 330)
    slow = {s for first in bursts for s in range(first, first + 5)}

    def attempt(n: int) -> tuple[Path, list[WatchRecord]] | None:
        run_dir = run_job(
            tmp_path / f"hour{n}", slow, 380, watch_windows_per_hour=1, watch_cooldown_steps=100
        )
        found = [r for r in records(run_dir) if r.first in bursts]
        # (a loaded machine's stalls before the first burst can take the place of its window: run again)
        return (run_dir, found) if [r.first for r in found][:1] == [100] else None

    tried = attempt(0) or attempt(1)
    assert tried is not None, "the first burst opened no window in two jobs"
    run_dir, found = tried
    # THEN the first opens a window, the second is skipped for the cool-down, the third for the hour's budget
    assert [(r.first, r.decision) for r in found] == [(100, "window"), (140, "skipped"), (330, "skipped")]
    assert found[1].reason is not None and found[1].reason.startswith("cool-down")
    assert found[2].reason == "1 windows in the last hour (watch_windows_per_hour=1)"
    notes = [n for n in read_manifest(run_dir).notes if "no window" in n]
    assert len(notes) == 2 and "watch_windows_per_hour=1" in notes[1]
    # AND once the rank's traces take watch_max_mb, no window is opened
    run_dir = run_job(tmp_path / "disk", set(range(100, 105)), 140, watch_max_mb=1e-6)
    (skipped,) = [r for r in records(run_dir) if r.first == 100]
    assert skipped.decision == "skipped" and skipped.reason is not None
    assert "watch_max_mb=1e-06" in skipped.reason
    assert traced_windows(run_dir) == [9]


def test_a_failing_watch_warns_once_and_training_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stepscope.capture.window import auto

    def broken(self: Any, step: int, wall_ns: int, buffer: Any) -> bool:
        raise RuntimeError("broken watch")

    monkeypatch.setattr(auto.AutoWindows, "step", broken)
    monitor = stepscope.performance_monitor(out_dir=str(tmp_path), watch=True, console=False, report=False)
    with pytest.warns(StepscopeWarning, match="the watch failed") as caught, monitor:
        for _ in range(60):
            monitor.step()
    assert len([w for w in caught if "watch" in str(w.message)]) == 1
    assert monitor.run_dir is not None
    lines = (monitor.run_dir / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 60  # every step counted


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"repeat": 0}, "with repeat=0 they never are"),
        ({"trace": False}, "it needs trace=True"),
    ],
)
def test_a_watch_that_could_never_open_a_window_is_refused(options: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem) as caught:
        stepscope.performance_monitor(watch=True, **options)
    assert "\n" not in str(caught.value) and "'watch'" in str(caught.value)


def test_stepscope_trigger_asks_a_watching_job(tmp_path: Path) -> None:
    monitor = stepscope.performance_monitor(out_dir=str(tmp_path), watch=True, console=False, report=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with monitor:
            for step in range(80):
                if step == 40:
                    assert monitor.run_dir is not None
                    assert main(["trigger", str(monitor.run_dir)]) == 0
                time.sleep(0.001)
                monitor.step()
    assert monitor.run_dir is not None
    (asked,) = [w for w in windows(monitor.run_dir) if w[0] > 10]
    assert 40 < asked[0] <= 40 + 2 * POLL + 2
