"""The monitor's console output (its tables and lines) goes to one stream, stderr, whether the monitor runs
inside the user's own script or under `stepscope run`: the script's stdout stays its own."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import stepscope
from stepscope.cli import main

from ..support.train import make_training

PLAIN_TRAIN = Path(__file__).resolve().parents[2] / "examples" / "plain_train.py"


def test_inside_the_users_script_the_tables_go_to_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train_step, model = make_training()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        monitor = stepscope.performance_monitor(
            model, out_dir=str(tmp_path), wait=2, warmup=1, active=1, flop_counter_step=1, memory_log_every=2,
            report=False,
        )  # fmt: skip
        step = monitor(train_step)
        for _ in range(6):
            step()
        print("the script's own line")
        monitor.close()
    out, err = capsys.readouterr()
    assert out == "the script's own line\n"
    assert "top ops, rank 0, window ending at step 3" in err
    assert "FLOPs of step 1, rank 0" in err and "stepscope memory step 1: rss " in err


def test_under_stepscope_run_the_tables_go_to_stderr_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    options = ["--wait", "1", "--warmup", "1", "--active", "1", "--no-report", "--out-dir", str(tmp_path)]
    assert main(["run", *options, str(PLAIN_TRAIN), "--steps", "6"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("rank 0: trained 6 steps") and out.count("\n") == 1
    assert "top ops, rank 0, window ending at step 2" in err
