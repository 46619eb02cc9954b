"""An on-demand run triggered several times, read back: every window it recorded is listed, and the run folder
holds only what the manifest indexes (no lock, no claim of a request) once the job has ended."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

import stepscope
from stepscope.cli import main
from stepscope.runfolder import read_manifest

from ..support.train import make_training

# both tests read one module fixture: a real on-demand run of 60 steps
pytestmark = pytest.mark.slow

TRIGGERED_AT = (3, 18, 33, 48)  # steps before which `stepscope trigger` asks for a window


@pytest.fixture(scope="module")
def four_windows(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real on-demand run of 60 steps, triggered four times (poll every 2 steps, warmup 1, active 2)."""
    out = tmp_path_factory.mktemp("on_demand")
    train_step, model = make_training()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        monitor = stepscope.performance_monitor(
            model, out_dir=str(out), on_demand=True, trigger_poll_steps=2, warmup=1, active=2,
            console=False, report=False,
        )  # fmt: skip
        step = monitor(train_step)
        for i in range(60):
            if i in TRIGGERED_AT:
                assert main(["trigger", str(monitor.run_dir)]) == 0
            step()
        monitor.close()
    assert monitor.run_dir is not None
    return monitor.run_dir


def test_every_on_demand_window_stays_listed(four_windows: Path, capsys: pytest.CaptureFixture[str]) -> None:
    traces = sorted(a.step for a in read_manifest(four_windows).of_kind("trace"))
    assert len(traces) == 4
    capsys.readouterr()
    assert main(["analyze", str(four_windows), "--json"]) == 0
    (times,) = json.loads(capsys.readouterr().out)["run"]["step_times"]
    # each window: the 2 active steps ending at its trace's step
    assert times["windows"] == [[last - 1, last] for last in traces]
    assert main(["analyze", str(four_windows)]) == 0
    listed = ", ".join(f"{last - 1}-{last}" for last in traces)
    assert f"profiled windows (active steps): {listed}" in capsys.readouterr().out
    # the manifest's notes name every window too
    notes = [n for n in read_manifest(four_windows).notes if n.startswith("on-demand window")]
    assert [n.split(": ")[0] for n in notes] == [f"on-demand window {i}" for i in (1, 2, 3, 4)]


def test_the_run_folder_keeps_no_lock_or_claim(four_windows: Path) -> None:
    # four requests were claimed (a .trigger-<id>.json each) and the manifest was merged under its lock
    assert sorted(p.name for p in four_windows.iterdir() if p.name.startswith(".")) == []
    assert not (four_windows / "trigger.json").exists()
