"""Memory collectors on CPU: periodic logging, memory timelines, snapshot orchestration (CUDA faked)."""

from __future__ import annotations

import json
import pickle
import warnings
from pathlib import Path
from typing import Any

import pytest

import stepscope
from stepscope.analysis.memory.snapshot import analyze_memory_file
from stepscope.capture.collectors import memory as capture_memory
from stepscope.capture.console import StepscopeWarning
from stepscope.runfolder import read_manifest

from ..support.train import bare_losses, make_training

QUIET = {"console": False}
# Windows of active steps [2, 3] and [6, 7]: traces after steps 3 and 7.
TWO_WINDOWS = {"wait": 1, "warmup": 1, "active": 2, "repeat": 2}


def run(out: Path, steps: int, **options: Any) -> tuple[stepscope.PerformanceMonitor, list[float]]:
    train_step, model = make_training()
    monitor = stepscope.performance_monitor(model, out_dir=str(out), **{**QUIET, **options})
    step = monitor(train_step)
    losses = [step() for _ in range(steps)]
    monitor.close()
    return monitor, losses


def artifacts(run_dir: Path, kind: str) -> list[tuple[int | None, str]]:
    return [(a.step, a.path) for a in read_manifest(run_dir).artifacts if a.kind == kind]


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_memory_log_rows_exactly_every_n_steps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN memory logging every 2 steps over 7 steps, console on
    monitor, losses = run(tmp_path, 7, memory_log_every=2, console=True, wait=0, warmup=0, active=1)
    run_dir = monitor.run_dir
    # THEN rows after steps 1, 3 and 5 (every 2nd step), with a non-zero RSS, in metrics.jsonl and the log
    logged = [m for m in metrics(run_dir) if "mem_rss_bytes" in m]
    assert [m["step"] for m in logged] == [1, 3, 5]
    assert all(m["mem_rss_bytes"] > 0 and 0 < m["mem_sys_percent"] <= 100 for m in logged)
    assert not any(k.startswith("mem_cuda") for m in logged for k in m)  # CPU: no CUDA fields
    ((step, path),) = artifacts(run_dir, "memory_log")
    assert step is None and path == "memory/rank0.jsonl"
    rows = [json.loads(line) for line in (run_dir / path).read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 3, 5]
    assert all(r["rss_bytes"] > 0 and "cuda_allocated_bytes" not in r for r in rows)
    out = capsys.readouterr().err  # the monitor prints on stderr
    assert out.count("stepscope memory step") == 3 and "stepscope memory step 3: rss " in out
    assert losses == bare_losses(7)


@pytest.mark.slow
def test_memory_timeline_per_window(tmp_path: Path) -> None:
    # GIVEN memory_timeline=True without the profiler options it needs
    with pytest.warns(StepscopeWarning, match="record_shapes, profile_memory, with_stack: turned on"):
        monitor, losses = run(tmp_path, 8, memory_timeline=True, **TWO_WINDOWS)
    run_dir = monitor.run_dir
    # THEN each window has a non-empty HTML and raw timeline, indexed in the manifest
    assert sorted(artifacts(run_dir, "memory_timeline")) == [
        (3, "memory_timeline/rank0_step3.raw.json.gz"),
        (7, "memory_timeline/rank0_step7.raw.json.gz"),
    ]
    assert sorted(artifacts(run_dir, "memory_timeline_html")) == [
        (3, "memory_timeline/rank0_step3.html"),
        (7, "memory_timeline/rank0_step7.html"),
    ]
    for _, path in artifacts(run_dir, "memory_timeline") + artifacts(run_dir, "memory_timeline_html"):
        assert (run_dir / path).stat().st_size > 0
    # AND the raw timeline is one our own analysis reads: the model's parameters are in it
    report = analyze_memory_file(run_dir / "memory_timeline/rank0_step7.raw.json.gz")
    assert report.devices[0].peak_allocated > 0
    assert report.devices[0].categories_at_peak["parameter"] == 4 * (32 * 32 + 32 + 32 * 4 + 4)
    # AND the options it turned on are in the saved config, and training is unchanged
    saved = stepscope.ProfileConfig.from_yaml(run_dir / "config.yaml")
    assert saved.record_shapes and saved.profile_memory and saved.with_stack
    assert losses == bare_losses(8)


@pytest.mark.slow
def test_memory_timeline_without_matplotlib_writes_raw_and_says_how_to_view(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(capture_memory, "has_matplotlib", lambda: False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monitor, _ = run(tmp_path, 8, memory_timeline=True, record_shapes=True, profile_memory=True,
                         with_stack=True, **TWO_WINDOWS)  # fmt: skip
    messages = [str(w.message) for w in caught if issubclass(w.category, StepscopeWarning)]
    assert len(messages) == 1 and "needs matplotlib" in messages[0] and "--html" in messages[0]
    assert [p for _, p in artifacts(monitor.run_dir, "memory_timeline")] == [
        "memory_timeline/rank0_step3.raw.json.gz",
        "memory_timeline/rank0_step7.raw.json.gz",
    ]


@pytest.mark.slow
def test_memory_snapshot_on_cpu_warns_once_and_training_goes_on(tmp_path: Path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monitor, losses = run(tmp_path, 8, memory_snapshot=True, **TWO_WINDOWS)
    messages = [str(w.message) for w in caught if issubclass(w.category, StepscopeWarning)]
    assert len(messages) == 1 and "CUDA memory history and snapshots need a GPU" in messages[0]
    assert artifacts(monitor.run_dir, "memory_snapshot") == []
    assert len(artifacts(monitor.run_dir, "trace")) == 2
    assert losses == bare_losses(8)


class FakeCudaMemory:
    """Stands in for torch.cuda.memory's history functions; a dump writes a tiny snapshot pickle."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def record(self, enabled: Any = "all", **kwargs: Any) -> None:
        self.calls.append(("record", enabled, kwargs.get("stacks"), kwargs.get("max_entries")))

    def dump(self, filename: str) -> None:
        self.calls.append(("dump", Path(filename).suffix))
        Path(filename).write_bytes(pickle.dumps({"segments": [], "device_traces": [[]]}))


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> FakeCudaMemory:
    import torch

    fake = FakeCudaMemory()
    monkeypatch.setattr(capture_memory, "cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", fake.record)
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", fake.dump)
    return fake


@pytest.mark.slow
def test_snapshot_history_covers_each_window_with_bounded_entries(
    tmp_path: Path, fake_cuda: FakeCudaMemory
) -> None:
    monitor, _ = run(tmp_path, 9, memory_snapshot=True, **TWO_WINDOWS)
    on = ("record", "all", "python", capture_memory.SNAPSHOT_MAX_ENTRIES)
    off = ("record", None, None, None)
    assert fake_cuda.calls == [on, ("dump", ".pickle"), off, on, ("dump", ".pickle"), off]
    assert artifacts(monitor.run_dir, "memory_snapshot") == [
        (3, "memory_snapshot/rank0_step3.pickle"),
        (7, "memory_snapshot/rank0_step7.pickle"),
    ]
    assert analyze_memory_file(monitor.run_dir / "memory_snapshot/rank0_step3.pickle").kind == "snapshot"


def test_oom_dumps_a_snapshot_and_is_re_raised(tmp_path: Path, fake_cuda: FakeCudaMemory) -> None:
    import torch

    train_step, model = make_training()
    monitor = stepscope.performance_monitor(model, out_dir=str(tmp_path), memory_snapshot=True, **QUIET,
                                            **TWO_WINDOWS)  # fmt: skip
    calls = iter(range(100))

    @monitor
    def step() -> float:
        if next(calls) == 5:  # outside a window: no history recorded, the snapshot still shows the segments
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return train_step()

    with pytest.raises(torch.OutOfMemoryError, match="Tried to allocate"):
        for _ in range(8):
            step()
    monitor.close()
    assert artifacts(monitor.run_dir, "memory_snapshot") == [
        (3, "memory_snapshot/rank0_step3.pickle"),
        (5, "memory_snapshot/rank0_step5_oom.pickle"),
    ]


@pytest.mark.slow
def test_failing_timeline_export_is_isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any) -> None:
        raise RuntimeError("export broke")

    monkeypatch.setattr(capture_memory, "_export_timeline", broken)
    with pytest.warns(StepscopeWarning, match="'memory_timeline' collector failed in on_window"):
        monitor, losses = run(tmp_path, 8, memory_timeline=True, record_shapes=True, profile_memory=True,
                              with_stack=True, **TWO_WINDOWS)  # fmt: skip
    assert len(artifacts(monitor.run_dir, "trace")) == 2  # the trace collector is unaffected
    assert losses == bare_losses(8)


def test_memory_log_cuda_columns_and_peak_reset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    # GIVEN a faked CUDA allocator whose peak only falls when it is reset
    state = {"peak": 0, "resets": 0, "allocated": 0}

    def allocated(device: int) -> int:
        state["allocated"] += 1000
        state["peak"] = max(state["peak"], state["allocated"] + 500)
        return state["allocated"]

    def reset(device: int) -> None:
        state["resets"] += 1
        state["peak"] = 0

    monkeypatch.setattr(capture_memory, "cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "memory_allocated", allocated)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d: 8000)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d: state["peak"])
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda d: 9000)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset)
    monitor, _ = run(tmp_path, 4, memory_log_every=2, wait=0, warmup=0, active=1)
    # THEN each row has the CUDA figures, and the peak is reset after each row
    logged = [m for m in metrics(monitor.run_dir) if "mem_rss_bytes" in m]
    assert [
        (m["step"], m["mem_cuda_allocated_bytes"], m["mem_cuda_peak_allocated_bytes"]) for m in logged
    ] == [
        (1, 1000, 1500),
        (3, 2000, 2500),
    ]
    assert logged[0]["mem_cuda_reserved_bytes"] == 8000 and state["resets"] == 2
