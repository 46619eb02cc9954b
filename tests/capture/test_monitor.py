from __future__ import annotations

import json
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

import stepscope
from stepscope.capture.console import StepscopeWarning
from stepscope.runfolder import read_manifest

from ..support.output import load_chrome_trace, profiler_steps
from ..support.train import bare_losses, make_training

QUIET = {"console": False}


def run_decorated(
    out: Path, steps: int, **options: object
) -> tuple[stepscope.PerformanceMonitor, list[float]]:
    train_step, model = make_training()
    monitor = stepscope.performance_monitor(model, out_dir=str(out), **QUIET, **options)
    step = monitor(train_step)
    losses = [step() for _ in range(steps)]
    monitor.close()
    return monitor, losses


def run_with_steps(
    out: Path, steps: int, **options: object
) -> tuple[stepscope.PerformanceMonitor, list[float]]:
    train_step, model = make_training()
    losses = []
    with stepscope.performance_monitor(model, out_dir=str(out), **QUIET, **options) as monitor:
        for _ in range(steps):
            with monitor.region("train"):
                losses.append(train_step())
            monitor.step()
    return monitor, losses


def artifact_index(run_dir: Path) -> list[tuple[str, int | None, int | None, str]]:
    return [(a.kind, a.rank, a.step, a.path) for a in read_manifest(run_dir).artifacts]


def assert_manifest_complete(run_dir: Path) -> None:
    """Every artifact listed exists; every trace is valid chrome-trace JSON."""
    for artifact in read_manifest(run_dir).artifacts:
        path = run_dir / artifact.path
        assert path.is_file(), artifact
        if artifact.kind == "trace":
            load_chrome_trace(path)


@pytest.mark.slow
def test_decorator_and_context_manager_write_the_same_artifacts(tmp_path: Path) -> None:
    # GIVEN the same schedule used both ways
    schedule = dict(wait=1, warmup=1, active=2, repeat=2)
    dec, dec_losses = run_decorated(tmp_path / "dec", 9, **schedule)
    ctx, ctx_losses = run_with_steps(tmp_path / "ctx", 9, **schedule)
    # THEN the manifests index the same artifacts and training is unchanged
    assert artifact_index(dec.run_dir) == artifact_index(ctx.run_dir)
    assert [a[0] for a in artifact_index(dec.run_dir)].count("trace") == 2
    assert dec_losses == ctx_losses == bare_losses(9)
    for monitor in (dec, ctx):
        assert_manifest_complete(monitor.run_dir)
        assert profiler_steps(monitor.run_dir / "traces/rank0_step7.json.gz") == [6, 7]


def test_run_folder_layout(tmp_path: Path) -> None:
    monitor, _ = run_decorated(tmp_path, 5, wait=0, warmup=1, active=2, repeat=1)
    run_dir = monitor.run_dir
    assert run_dir.parent == tmp_path
    assert re.fullmatch(r"\d{4}-\d\d-\d\d__\d\d-\d\d-\d\d_[0-9a-f]{8}", run_dir.name)
    manifest = read_manifest(run_dir)
    assert manifest.schema == "stepscope.manifest/2" and manifest.run_name == run_dir.name
    assert manifest.world_size == 1 and manifest.profiled_ranks == [0]
    assert manifest.schedule == {"wait": 0, "warmup": 1, "active": 2, "repeat": 1, "skip_first": 0}
    assert set(manifest.versions) == {"stepscope", "torch", "python"}
    assert stepscope.ProfileConfig.from_yaml(run_dir / "config.yaml") == monitor.config
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, 1, 2, 3, 4]
    assert all(line["rank"] == 0 and line["wall_ms"] > 0 for line in lines)
    assert [line["phase"] for line in lines] == ["warmup", "record", "record_and_save", "none", "none"]
    summary = (run_dir / "summaries/rank0_step2.txt").read_text()
    assert summary.startswith("stepscope summary: rank 0, window ending at step 2 (steps 1-2)")
    assert "CPU ops by self time" in summary and "Memory overview" in summary and "aten::addmm" in summary
    # after close (and the report's manifest update) nothing is left but what the manifest indexes: no lock file
    assert [p.name for p in run_dir.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize(
    ("schedule", "steps", "expected"),
    [
        (dict(wait=0, warmup=0, active=1, repeat=1), 3, {0: [0]}),
        (dict(wait=1, warmup=1, active=2, repeat=3), 13, {3: [2, 3], 7: [6, 7], 11: [10, 11]}),
        (dict(wait=2, warmup=1, active=1, repeat=2, skip_first=3), 12, {6: [6], 10: [10]}),
        (dict(wait=1, warmup=0, active=3, repeat=0), 10, {3: [1, 2, 3], 7: [5, 6, 7]}),
    ],
)
@pytest.mark.slow
def test_schedule_records_exactly_the_expected_steps(
    tmp_path: Path, schedule: dict[str, int], steps: int, expected: dict[int, list[int]]
) -> None:
    monitor, _ = run_decorated(tmp_path, steps, **schedule)
    traces = {
        a.step: monitor.run_dir / a.path
        for a in read_manifest(monitor.run_dir).artifacts
        if a.kind == "trace"
    }
    # repeat=0 runs forever: the job ends inside a window, whose partial trace is written too
    if schedule.get("repeat") == 0:
        traces = {s: p for s, p in traces.items() if s in expected}
    assert {step: profiler_steps(path) for step, path in traces.items()} == expected


def test_short_job_warns_and_leaves_a_valid_manifest(tmp_path: Path) -> None:
    with pytest.warns(StepscopeWarning, match="before the first active window completed"):
        monitor, losses = run_decorated(tmp_path, 3, wait=5, warmup=2, active=3)
    assert losses == bare_losses(3)
    manifest = read_manifest(monitor.run_dir)
    assert any("before the first active window" in note for note in manifest.notes)
    # no trace; the report still shows the step times and says why there is nothing else
    assert [a.kind for a in manifest.artifacts] == ["config", "metrics", "report"]
    assert "the run has no traces" in (monitor.run_dir / "report.html").read_text()
    assert_manifest_complete(monitor.run_dir)


def test_job_ending_inside_a_window_writes_the_partial_trace(tmp_path: Path) -> None:
    with pytest.warns(StepscopeWarning):
        monitor, _ = run_decorated(tmp_path, 3, wait=1, warmup=0, active=4)
    traces = [a for a in read_manifest(monitor.run_dir).artifacts if a.kind == "trace"]
    # steps 1 and 2 ran in the window; step 3 began when the call of step 2 returned (a step holds the fetch of
    # its batch) and ran until close(), as in the context-manager form; no span for a step that never began
    assert len(traces) == 1 and traces[0].step == 2
    assert profiler_steps(monitor.run_dir / traces[0].path) == [1, 2, 3]


def test_failing_collector_warns_once_and_training_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN an export that fails (a full disk, say)
    from stepscope.capture.window import trace

    def broken_export(self: object, prof: object, first: int, step: int, partial: bool) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(trace.TraceCollector, "_export", broken_export)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monitor, losses = run_decorated(tmp_path, 12, wait=1, warmup=1, active=1, repeat=3)
    ours = [w for w in caught if issubclass(w.category, StepscopeWarning)]
    # THEN one warning names the collector and the cause, and the losses are those of a bare run
    assert len(ours) == 1
    assert "'trace' collector failed" in str(ours[0].message) and "No space left" in str(ours[0].message)
    assert losses == bare_losses(12)
    assert len((monitor.run_dir / "metrics.jsonl").read_text().splitlines()) == 12


def test_failing_start_is_isolated_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from stepscope.capture.window import trace

    def broken_start(self: object) -> None:
        raise RuntimeError("profiler already running")

    monkeypatch.setattr(trace.TraceCollector, "start", broken_start)
    with pytest.warns(StepscopeWarning, match="failed in start"):
        _, losses = run_with_steps(tmp_path, 6, wait=0, warmup=0, active=2)
    assert losses == bare_losses(6)


def test_unwritable_output_folder_leaves_training_unchanged(tmp_path: Path) -> None:
    # GIVEN an output "folder" that cannot be created (a regular file stands in its way)
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("")
    with pytest.warns(StepscopeWarning, match="cannot write the run folder"):
        monitor, losses = run_decorated(blocker / "runs", 8, wait=0, warmup=0, active=2)
    assert losses == bare_losses(8)
    assert not monitor.recording


@pytest.mark.skipif(
    sys.platform == "win32" or __import__("os").geteuid() == 0, reason="root ignores permissions"
)
def test_read_only_output_folder(tmp_path: Path) -> None:
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o500)
    try:
        with pytest.warns(StepscopeWarning, match="cannot write the run folder"):
            _, losses = run_decorated(out, 5, wait=0, warmup=0, active=2)
        assert losses == bare_losses(5)
    finally:
        out.chmod(0o700)


def test_step_exception_propagates_and_monitor_closes(tmp_path: Path) -> None:
    monitor = stepscope.performance_monitor(out_dir=str(tmp_path), wait=0, warmup=0, active=1, **QUIET)

    @monitor
    def failing() -> None:
        raise ValueError("bad batch")

    with pytest.raises(ValueError, match="bad batch"):
        failing()
    monitor.close()
    assert read_manifest(monitor.run_dir).run_name


def test_return_value_and_metadata_pass_through(tmp_path: Path) -> None:
    monitor = stepscope.performance_monitor(out_dir=str(tmp_path), wait=0, warmup=0, active=1, **QUIET)

    @monitor
    def add(a: int, b: int = 2) -> dict[str, int]:
        """Adds."""
        return {"sum": a + b}

    assert add(1, b=5) == {"sum": 6} and add.__name__ == "add" and add.__doc__ == "Adds."
    monitor.close()


def test_disabled_monitor_is_a_plain_pass_through_without_torch() -> None:
    code = (
        "import sys, stepscope\n"
        "m = stepscope.performance_monitor(enabled=False)\n"
        "def f(x): return x * 2\n"
        "assert m(f) is f and f(4) == 8\n"
        "with m:\n"
        "    with m.region('forward'): pass\n"
        "    m.step()\n"
        "assert m.run_dir is None\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_import_stepscope_does_not_import_torch() -> None:
    code = "import sys, stepscope, stepscope.runfolder, stepscope.capture.config; assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_nsight_on_a_cpu_build_warns_once_and_training_goes_on(tmp_path: Path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monitor, losses = run_decorated(tmp_path, 5, wait=0, warmup=0, active=2, nsight=True)
    ours = [str(w.message) for w in caught if issubclass(w.category, StepscopeWarning)]
    assert ours == [
        "stepscope: nsight=True needs CUDA (NVTX and cudaProfilerStart/Stop); this CPU run ignores it"
    ]
    assert losses == bare_losses(5)
    assert [a.kind for a in read_manifest(monitor.run_dir).artifacts].count("trace") == 1


def test_explicit_start_and_step_without_with(tmp_path: Path) -> None:
    train_step, model = make_training()
    monitor = stepscope.performance_monitor(model, out_dir=str(tmp_path), wait=0, warmup=0, active=2, **QUIET)
    monitor.start()
    losses = []
    for _ in range(4):
        losses.append(train_step())
        monitor.step()
    monitor.close()
    assert losses == bare_losses(4)
    assert profiler_steps(monitor.run_dir / "traces/rank0_step1.json.gz") == [0, 1]


def test_unserialisable_metric_switches_metrics_off_not_training(tmp_path: Path) -> None:
    # GIVEN a collector that returns a value JSON cannot hold for the step's metrics line
    from stepscope.capture.window import trace

    original = trace.TraceCollector.after_step

    def adds_an_object(self: trace.TraceCollector, step: int, wall_ms: float) -> dict[str, object]:
        original(self, step, wall_ms)
        return {"tflops": object()}

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trace.TraceCollector, "after_step", adds_an_object)
        with pytest.warns(StepscopeWarning, match="cannot write metrics.jsonl"):
            monitor, losses = run_decorated(tmp_path, 6, wait=0, warmup=0, active=2)
    assert losses == bare_losses(6)
    assert [a.kind for a in read_manifest(monitor.run_dir).artifacts].count("trace") == 1


def test_a_step_that_raises_while_waiting_reaches_step_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a monitor in its wait phase (quiet steps: no collector works at them) and a step that raises
    from stepscope.capture.window import trace

    seen: list[tuple[int, str]] = []
    monkeypatch.setattr(
        trace.TraceCollector, "step_failed", lambda self, step, exc: seen.append((step, str(exc)))
    )
    monitor = stepscope.performance_monitor(out_dir=str(tmp_path), wait=5, warmup=1, active=1, **QUIET)
    calls = iter([None, ValueError("bad batch")])

    @monitor
    def train_step() -> None:
        error = next(calls)
        if error is not None:
            raise error

    train_step()
    with pytest.raises(ValueError, match="bad batch"):
        train_step()
    monitor.close()
    # THEN the collectors heard of it (an OOM snapshot is taken there), and the error reached the caller
    assert seen == [(1, "bad batch")]


@pytest.mark.slow
def test_a_resumed_job_keeps_its_step_numbers(tmp_path: Path) -> None:
    # GIVEN a job resumed at step 100 (the callbacks pass the framework's global step)
    monitor = stepscope.performance_monitor(out_dir=str(tmp_path), wait=1, warmup=1, active=2, console=False)
    monitor.start(first_step=100)
    for _ in range(5):
        monitor.step()
    monitor.close()
    # THEN the schedule counts from 100 and the steps keep the job's numbers
    run_dir = monitor.run_dir
    assert run_dir is not None
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [100, 101, 102, 103, 104]
    assert profiler_steps(run_dir / "traces/rank0_step103.json.gz") == [102, 103]


@pytest.mark.slow
def test_a_failing_step_listener_is_dropped_with_one_warning(tmp_path: Path) -> None:
    monitor = stepscope.performance_monitor(out_dir=str(tmp_path), wait=0, warmup=0, active=3, console=False)
    seen: list[int] = []

    def listener(line: Any) -> None:
        seen.append(line.step)
        raise RuntimeError("listener bug")

    monitor.add_step_listener(listener)
    with pytest.warns(StepscopeWarning, match="listener bug") as caught, monitor:
        for _ in range(3):
            monitor.step()
    assert seen == [0]
    assert len([w for w in caught if "listener" in str(w.message)]) == 1
