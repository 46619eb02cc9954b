"""The system sampler: interval, clean stop, NVML columns (NVML faked), through the monitor."""

from __future__ import annotations

import itertools
import json
import statistics
import sys
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import stepscope
from stepscope.capture.collectors.system import THREAD_NAME, SystemSampler
from stepscope.runfolder import read_manifest

from ..support.train import bare_losses, make_training

# each test takes a second or two; a sampler that never stops must not hold the suite for the default 300 s
pytestmark = pytest.mark.timeout(60)

BASE_FIELDS = [
    "t_s", "unix_time", "process_cpu_percent", "system_cpu_percent", "rss_bytes", "sys_used_bytes", "sys_percent"
]  # fmt: skip


def read_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


def wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    """Poll `condition` until it holds; fail after `timeout` seconds (a loaded machine can be slow, not wrong)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not reached within {timeout} s"
        time.sleep(0.005)


def lines_in(path: Path) -> int:
    return len(path.read_bytes().splitlines()) if path.exists() else 0


def test_samples_at_the_interval_and_stops_cleanly(tmp_path: Path) -> None:
    # GIVEN a sampler every 50 ms, stopped once it has taken 10 samples
    sampler = SystemSampler(tmp_path / "system.jsonl", 0.05, use_nvml=False)
    start = time.monotonic()
    sampler.start()
    wait_until(lambda: sampler.samples >= 10)
    sampler.stop()
    elapsed = time.monotonic() - start
    # THEN the thread is gone, every sample is a row, and the rows are ~50 ms apart (the machine is shared: a
    # loose tolerance); no more samples were taken than the interval allows in the time it ran
    assert sampler_threads() == []
    rows = read_rows(tmp_path / "system.jsonl")
    assert list(rows[0]) == BASE_FIELDS  # no "gpus" without NVML
    assert 10 <= len(rows) == sampler.samples <= elapsed / 0.05 + 1
    times = [float(r["t_s"]) for r in rows]
    assert times[0] < 0.05
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert statistics.median(gaps) == pytest.approx(0.05, abs=0.02)
    assert all(r["rss_bytes"] > 0 and 0 < r["sys_percent"] <= 100 for r in rows)


def test_interval_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="interval"):
        SystemSampler(tmp_path / "s.jsonl", 0)


def fake_pynvml() -> types.ModuleType:
    """Two GPUs; the second cannot report power (left out)."""
    nv = types.ModuleType("pynvml")
    nv.NVML_TEMPERATURE_GPU = 0  # type: ignore[attr-defined]

    class NVMLError(Exception):
        pass

    def power(h: int) -> int:
        if h == 1:
            raise NVMLError("Not Supported")
        return 250_500  # milliwatts

    funcs: dict[str, Any] = {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: 2,
        "nvmlDeviceGetHandleByIndex": lambda i: i,
        "nvmlDeviceGetUtilizationRates": lambda h: types.SimpleNamespace(gpu=90 + h, memory=40 + h),
        "nvmlDeviceGetMemoryInfo": lambda h: types.SimpleNamespace(
            used=1000 * (h + 1), free=80_000 - 1000 * (h + 1), total=80_000
        ),
        "nvmlDeviceGetPowerUsage": power,
        "nvmlDeviceGetTemperature": lambda h, sensor: 60 + h,
    }
    for name, fn in funcs.items():
        setattr(nv, name, fn)
    return nv


def test_nvml_columns_per_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    sampler = SystemSampler(tmp_path / "system.jsonl", 0.02)
    sampler.start()
    wait_until(lambda: sampler.samples >= 1)
    sampler.stop()
    row = read_rows(tmp_path / "system.jsonl")[0]
    assert row["gpus"] == [
        {"index": 0, "util_percent": 90, "mem_used_bytes": 1000, "mem_total_bytes": 80000, "power_w": 250.5,
         "temp_c": 60, "util_mem_percent": 40, "mem_free_bytes": 79000},
        {"index": 1, "util_percent": 91, "mem_used_bytes": 2000, "mem_total_bytes": 80000, "temp_c": 61,
         "util_mem_percent": 41, "mem_free_bytes": 78000},
    ]  # fmt: skip


def test_without_nvml_there_are_no_gpu_columns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails as when nvidia-ml-py is not installed
    sampler = SystemSampler(tmp_path / "system.jsonl", 0.05)
    sampler.start()
    sampler.stop()
    assert sampler.nvml is not None and "not installed" in sampler.nvml.problem
    assert list(read_rows(tmp_path / "system.jsonl")[0]) == BASE_FIELDS


def test_monitor_runs_the_sampler_for_the_run(tmp_path: Path) -> None:
    train_step, model = make_training()
    monitor = stepscope.performance_monitor(
        model, out_dir=str(tmp_path), console=False, system_sample_interval=0.02, wait=0, warmup=0, active=1
    )
    step = monitor(train_step)
    losses = [step() for _ in range(4)]
    assert len(sampler_threads()) == 1
    # the sampler runs beside the steps: the run lasts until it has written 3 rows
    wait_until(lambda: lines_in(monitor.run_dir / "system" / "rank0.jsonl") >= 3)
    monitor.close()
    assert sampler_threads() == []
    (artifact,) = [a for a in read_manifest(monitor.run_dir).artifacts if a.kind == "system"]
    assert artifact.path == "system/rank0.jsonl" and artifact.rank == 0
    assert artifact.schema == "stepscope.system/1"
    assert len(read_rows(monitor.run_dir / artifact.path)) >= 3
    assert losses == bare_losses(4)
