"""trace_budget_mb: one warning, before the window is exported, when the window's trace will exceed the budget;
and `stepscope estimate`, whose figure must match the window of a real run with the same options."""

from __future__ import annotations

import argparse
import gzip
import json
import re
import warnings
from pathlib import Path
from typing import Any

import pytest

import stepscope
from stepscope.capture.console import StepscopeWarning
from stepscope.cli import main
from stepscope.errors import ConfigError
from stepscope.runfolder import read_manifest

from ..support.train import make_training

REPO = Path(__file__).resolve().parents[2]
PLAIN_TRAIN = REPO / "examples" / "plain_train.py"
# with_stack and record_shapes on: the warning must name them
WINDOW = {"wait": 1, "warmup": 1, "active": 4, "with_stack": True, "record_shapes": True}
QUIET = {"console": False, "report": False}


def window_bytes(run_dir: Path, windows: int = 1) -> tuple[int, int]:
    """(JSON bytes, .json.gz bytes) of the first trace of a run that has `windows` traces."""
    traces = sorted(read_manifest(run_dir).of_kind("trace"), key=lambda a: a.step or 0)
    assert len(traces) == windows, traces
    packed = (run_dir / traces[0].path).read_bytes()
    return len(gzip.decompress(packed)), len(packed)


def profile(out: Path, steps: int = 8, **options: Any) -> tuple[stepscope.PerformanceMonitor, list[Any]]:
    """GIVEN a small training loop under a monitor; returns it and the stepscope warnings, each with whether a
    trace file existed when it was raised."""
    train_step, model = make_training()
    monitor = stepscope.performance_monitor(model, out_dir=str(out), **QUIET, **WINDOW, **options)
    step = monitor(train_step)
    seen: list[Any] = []

    def show(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        if issubclass(category, StepscopeWarning):
            traces = monitor.run_dir / "traces" if monitor.run_dir else None
            exported = traces is not None and any(traces.glob("*.json.gz"))
            seen.append((str(message), exported))

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        for _ in range(steps):
            step()
        monitor.close()
    return monitor, seen


@pytest.fixture(scope="module")
def real_window(tmp_path_factory: pytest.TempPathFactory) -> int:
    """JSON bytes of the window of WINDOW, recorded without a budget."""
    monitor, seen = profile(tmp_path_factory.mktemp("real"))
    assert seen == []
    assert monitor.run_dir is not None
    return window_bytes(monitor.run_dir)[0]


@pytest.mark.slow
def test_a_budget_below_the_window_warns_once_before_the_export(tmp_path: Path, real_window: int) -> None:
    # WHEN the budget holds about half of a window (2 of its 4 active steps), and two windows are recorded
    budget_mb = real_window / 2 / 1e6
    monitor, seen = profile(tmp_path, steps=14, repeat=2, trace_budget_mb=budget_mb)
    # THEN one warning for the run, raised before any trace was written, with the estimate, the budget, advice
    assert len(seen) == 1, seen
    message, exported = seen[0]
    assert not exported
    estimate = re.search(r"will be about ([\d.]+) MB of JSON", message)
    assert estimate is not None and float(estimate.group(1)) == pytest.approx(real_window / 1e6, rel=0.25)
    assert f"over trace_budget_mb={budget_mb:g}" in message
    fit = re.search(r"(\d+) active steps? fits? in it \(active=(\d+)\)", message)
    assert fit is not None and fit.group(1) == fit.group(2) and int(fit.group(1)) in (1, 2), message
    assert "drop with_stack (" in message and "record_shapes (" in message
    assert "profile_memory" not in message  # off: nothing to drop
    # AND the run goes on: the windows are exported as usual
    assert monitor.run_dir is not None and window_bytes(monitor.run_dir, windows=2)[0] > 0


@pytest.mark.slow
def test_a_generous_budget_warns_nothing(tmp_path: Path, real_window: int) -> None:
    _, seen = profile(tmp_path, trace_budget_mb=2 * real_window / 1e6, repeat=2, steps=14)
    assert seen == []


@pytest.mark.slow
def test_a_failing_budget_check_switches_itself_off_and_traces_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import stepscope.capture.window.budget as budget

    def broken(raw: bytes, gz_size: int | None = None) -> Any:
        raise ValueError("cannot read this trace")

    monkeypatch.setattr(budget, "measure_trace", broken)
    monitor, seen = profile(tmp_path, trace_budget_mb=0.001)
    assert [m for m, _ in seen] == [
        "stepscope: the trace budget check failed while measuring a step (ValueError: cannot read this trace); "
        "it is off for this run, traces go on"
    ]
    assert monitor.run_dir is not None and window_bytes(monitor.run_dir)[0] > 0


def test_the_budget_is_an_option_of_every_front_end() -> None:
    with pytest.raises(ConfigError, match="'trace_budget_mb'"):
        stepscope.ProfileConfig.build(trace_budget_mb=0)
    parser = stepscope.add_profiling_args(argparse.ArgumentParser())
    args = parser.parse_args(["--enable-profiling", "--profiler-trace-budget-mb", "2.5"])
    assert stepscope.ProfileConfig.from_args(args).trace_budget_mb == 2.5


@pytest.mark.slow
def test_estimate_matches_the_window_of_a_real_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    options = ["--wait", "1", "--warmup", "1", "--active", "3", "--with-stack", "--trace-budget-mb", "0.1"]
    script = [str(PLAIN_TRAIN), "--steps", "12"]
    # GIVEN the estimate of a config
    assert main(["estimate", "--json", *options, *script]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "stepscope.estimate/1" and doc["active"] == 3 and doc["options"] == ["with_stack"]
    # WHEN the script runs for real with the same config
    out = tmp_path / "runs"
    assert main(["run", *options, "--no-console", "--no-report", "--out-dir", str(out), *script]) == 0
    (run_dir,) = out.iterdir()
    real_json, real_gz = window_bytes(run_dir)
    # THEN the estimate is within 25% of the real window, on disk too
    assert doc["window"]["json_bytes"] == pytest.approx(real_json, rel=0.25)
    assert doc["window"]["gz_bytes"] == pytest.approx(real_gz, rel=0.25)
    assert doc["budget"] == {"mb": 0.1, "fits": real_json <= 0.1e6, "max_active": doc["budget"]["max_active"]}
    assert 0 < doc["option_bytes_per_step"]["with_stack"] < doc["per_step"]["json_bytes"]


@pytest.mark.slow
def test_estimate_as_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--active", "5", str(PLAIN_TRAIN), "--steps", "8"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"stepscope estimate: {PLAIN_TRAIN} (trace options: none; 2 steps measured)\n")
    assert re.search(r"per window +[\d.]+ MB of JSON, [\d.]+ MB on disk \(\.json\.gz\) for active=5", out)
    assert "rank 0: trained" not in out  # the script's own output went to stderr


def test_estimate_of_a_script_too_short_says_how_many_steps_it_needs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["estimate", str(PLAIN_TRAIN), "--steps", "3"]) == 2
    err = capsys.readouterr().err
    assert "before the measured window completed: the estimate needs 5 optimizer steps" in err
