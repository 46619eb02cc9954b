"""A window's end, as real jobs: the training thread pays for torch's export only (the summary, the console
table and the gzip come from a worker, every window, all of it there at close), and an export that fails (a
file-size limit, a full disk) is skipped, not indexed, and leaves nothing behind."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

import stepscope
from stepscope.capture.console import StepscopeWarning
from stepscope.cli import main as cli_main
from stepscope.runfolder import read_manifest

from ..support.jobs import run_job
from ..support.train import make_training


def test_the_summary_and_the_table_of_every_window_come_without_torchs_key_averages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN torch's key_averages (its Python parse of a window: 1.6 s of a 1.7 s window end) failing if called
    import torch

    def never(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("key_averages called at a window's end")

    monkeypatch.setattr(torch.profiler.profile, "key_averages", never)
    # WHEN three windows are recorded, the last one cut short by close
    train_step, model = make_training()
    monitor = stepscope.performance_monitor(
        model, out_dir=str(tmp_path), wait=1, warmup=1, active=2, repeat=3, report=False
    )
    step = monitor(train_step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(11):
            step()
        monitor.close()
    # THEN no warning; every window has its trace, its summary and its console table by close, in order
    assert [str(w.message) for w in caught if issubclass(w.category, StepscopeWarning)] == []
    assert monitor.run_dir is not None
    artifacts = read_manifest(monitor.run_dir).artifacts
    assert sorted(a.step for a in artifacts if a.kind == "trace") == [3, 7, 10]
    assert sorted(a.step for a in artifacts if a.kind == "summary") == [3, 7, 10]
    err = capsys.readouterr().err
    titles = [f"top ops, rank 0, window ending at step {s}" for s in (3, 7, 10)]
    assert all(t in err for t in titles) and [err.index(t) for t in titles] == sorted(
        err.index(t) for t in titles
    )
    assert "aten::addmm" in err and "ProfilerStep" not in err
    summary = (monitor.run_dir / "summaries/rank0_step10.txt").read_text()
    assert "(steps 10-10)" in summary and "aten::addmm" in summary and "Memory overview" in summary
    # AND the traces are whole: the run analyzes
    assert cli_main(["analyze", str(monitor.run_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["schema"].startswith("stepscope.analysis/")


LIMITED_JOB = """
import glob, resource, time
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
m = stepscope.performance_monitor(model, out_dir="out", wait=1, warmup=1, active=2, repeat=3, console=False,
                               report=False)
s = m(step)
for i in range(12):
    s()
    if i == 3:  # the first window is exported: wait for its worker, then files may hold {limit} bytes at most
        while not glob.glob("out/*/traces/rank0_step3.json.gz"):
            time.sleep(0.02)
        resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
m.close()
print("trained", flush=True)
"""


@pytest.mark.slow
def test_an_export_cut_short_by_a_file_size_limit_skips_the_window_and_leaves_nothing(tmp_path: Path) -> None:
    # GIVEN a job whose files may grow to 16 kB after its first window (a window's JSON is ~40 kB): torch logs
    # "Failed to write" and raises nothing
    done = run_job(tmp_path, LIMITED_JOB.format(limit=16_000))
    # THEN the job ends normally, with one warning for the windows it could not write
    assert done.returncode == 0 and "trained" in done.stdout, done.stderr[-2000:]
    assert done.stderr.count("StepscopeWarning") == 1, done.stderr[-2000:]
    assert "window ending at step 7 (rank 0) was not written" in done.stderr
    (run,) = (tmp_path / "out").iterdir()
    manifest = read_manifest(run)
    # AND only the first window is indexed; no temp file of any export is left (kineto's own included)
    assert [a.path for a in manifest.artifacts if a.kind == "trace"] == ["traces/rank0_step3.json.gz"]
    assert sorted(p.name for p in (run / "traces").iterdir()) == ["rank0_step3.json.gz"]
    # AND the metrics of every step are there and the manifest is finished (its notes name the windows skipped)
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(12))
    assert any("ending at step 7, 11 was not written" in note for note in manifest.notes), manifest.notes
    # AND the run analyzes, from the window that was written
    assert cli_main(["analyze", str(run), "--json"]) == 0


def test_a_trace_the_loader_refuses_is_not_indexed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN torch exporting a file that looks whole at both ends but is not JSON inside
    import torch

    def broken_export(self: Any, path: str) -> None:
        Path(path).write_bytes(b'{"traceEvents": [{"ph": "X", oops}], "traceName": "x"}')

    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", broken_export)
    train_step, model = make_training()
    monitor = stepscope.performance_monitor(
        model, out_dir=str(tmp_path), wait=0, warmup=1, active=1, repeat=2, console=False, report=False
    )
    step = monitor(train_step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(4):
            step()
        monitor.close()
    # THEN one warning names the first window; nothing is indexed and no temp file is left
    messages = [str(w.message) for w in caught if issubclass(w.category, StepscopeWarning)]
    assert len(messages) == 1 and "window ending at step 1 (rank 0) was not written" in messages[0], messages
    assert monitor.run_dir is not None
    assert [a for a in read_manifest(monitor.run_dir).artifacts if a.kind in ("trace", "summary")] == []
    assert list((monitor.run_dir / "traces").iterdir()) == []


@pytest.mark.slow
def test_windows_that_end_faster_than_their_summaries_keep_every_trace_and_close_promptly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a window every two steps, for 120 steps: far faster than a child can summarise each one
    train_step, model = make_training()
    monitor = stepscope.performance_monitor(
        model, out_dir=str(tmp_path), wait=0, warmup=1, active=1, repeat=0, report=False
    )
    step = monitor(train_step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(120):
            step()
        monitor.close()
    # THEN every window's trace is there at close; the backlog is said once, and the windows it caught have
    # their trace without a summary (the first ones, summarised, keep theirs)
    said = [str(w.message) for w in caught if "faster than their summaries" in str(w.message)]
    assert len(said) == 1, said
    assert monitor.run_dir is not None
    artifacts = read_manifest(monitor.run_dir).artifacts
    traced = sorted(a.step for a in artifacts if a.kind == "trace")
    assert traced == list(range(1, 120, 2))
    summarised = [a.step for a in artifacts if a.kind == "summary"]
    assert 1 in summarised and len(summarised) < len(traced)
    assert "window ending at step 1" in capsys.readouterr().err
    assert cli_main(["analyze", str(monitor.run_dir), "--json"]) == 0


def test_a_summary_without_a_folder_costs_that_summary_alone(tmp_path: Path) -> None:
    # GIVEN a job of two windows whose run folder gets a file where the summaries folder goes, before either ends
    import os

    import torch

    model = torch.nn.Linear(16, 16)
    monitor = stepscope.performance_monitor(
        model, out_dir=str(tmp_path), wait=1, warmup=1, active=2, repeat=2, console=False, report=False
    )
    with warnings.catch_warnings(record=True) as caught, monitor:
        warnings.simplefilter("always")
        for step in range(12):
            if step == 1:
                folder = monitor.run_dir / "summaries"
                if folder.is_dir():
                    os.rmdir(folder)
                folder.write_text("a file, not a folder")
            model(torch.randn(4, 16)).sum().backward()
            monitor.step()
    # THEN both windows' traces are written and indexed, the summaries said lost once, nothing left half-written
    manifest = read_manifest(monitor.run_dir)
    assert [a.step for a in manifest.of_kind("trace")] == [3, 7]
    assert not manifest.of_kind("summary")
    said = [str(w.message) for w in caught if issubclass(w.category, StepscopeWarning)]
    assert len(said) == 1 and "summary of the window ending at step 3" in said[0] and "trace only" in said[0]
    assert not [p for p in monitor.run_dir.rglob("*") if p.name.startswith(".")]


def test_a_ctrl_c_during_a_windows_export_keeps_the_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a job whose first window's export is cut short by a Ctrl-C (torch's export raises KeyboardInterrupt)
    import torch

    real = torch.profiler.profile.export_chrome_trace
    calls: list[str] = []

    def interrupted_once(self: Any, path: str) -> Any:
        calls.append(path)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real(self, path)

    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", interrupted_once)
    model = torch.nn.Linear(8, 8)
    monitor = stepscope.performance_monitor(
        model, out_dir=str(tmp_path), wait=0, warmup=1, active=2, console=False, report=False
    )
    with warnings.catch_warnings(record=True) as caught, pytest.raises(KeyboardInterrupt):
        warnings.simplefilter("always")
        with monitor:
            for _ in range(6):
                model(torch.randn(2, 8)).sum().backward()
                monitor.step()
    # THEN the window is exported again at close and indexed, and no note says the job ended before it
    manifest = read_manifest(monitor.run_dir)
    assert [a.step for a in manifest.of_kind("trace")] == [2] and len(calls) == 2
    said = [str(w.message) for w in caught] + manifest.notes
    assert not [s for s in said if "before the first active window completed" in s], said


def test_the_stall_of_a_windows_end_is_in_the_metrics_and_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a job whose window's export takes 300 ms (torch's export slowed)
    import time

    import torch

    from stepscope.report.data import collect_report

    real = torch.profiler.profile.export_chrome_trace

    def slow(self: Any, path: str) -> Any:
        time.sleep(0.3)
        return real(self, path)

    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", slow)
    model = torch.nn.Linear(8, 8)
    monitor = stepscope.performance_monitor(
        model, out_dir=str(tmp_path), wait=1, warmup=1, active=2, console=False, report=False
    )
    with monitor:
        for _ in range(6):
            model(torch.randn(2, 8)).sum().backward()
            monitor.step()
    # THEN the step that ended the window says how long the job waited after it, beside its own time
    lines = {
        m["step"]: m for m in map(json.loads, (monitor.run_dir / "metrics.jsonl").read_text().splitlines())
    }
    assert lines[3]["phase"] == "record_and_save" and lines[3]["monitor_ms"] >= 300 > lines[3]["wall_ms"]
    assert "monitor_ms" not in lines[5] and "monitor_ms" not in lines[2]
    # AND the report's step chart marks it at its whole time
    points = {p.step: p for p in collect_report(monitor.run_dir).run.steps}
    assert points[3].whole_ms == pytest.approx(lines[3]["wall_ms"] + lines[3]["monitor_ms"], abs=1e-3)
    assert points[5].whole_ms is None
