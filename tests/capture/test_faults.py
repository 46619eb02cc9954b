"""Capture faults as real jobs: the training process must end as it would without stepscope (its exit code, its
atexit handlers, its profiler), never with a signal, and the traces it could write are written."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

import stepscope
from stepscope.analysis.read.loader import load_trace
from stepscope.capture.console import StepscopeWarning
from stepscope.cli import main as cli_main
from stepscope.errors import InputError
from stepscope.runfolder import read_manifest

from ..support.jobs import run_job
from ..support.train import make_training

TESTS = Path(__file__).resolve().parents[1]


def short_run(active: int) -> str:
    """A job body: three steps under a monitor whose window of `active` steps follows one warmup step."""
    return f"""
m = stepscope.performance_monitor(model, out_dir="out", wait=0, warmup=1, active={active}, console=False)
s = m(step)
for _ in range(3):
    s()
m.close()
"""


def train_and_close(
    out: Path, steps: int, **options: Any
) -> tuple[stepscope.PerformanceMonitor, list[float], list[str]]:
    """`steps` steps of the test training under a decorating monitor, then close: (monitor, losses, the
    StepscopeWarnings said meanwhile)."""
    train_step, model = make_training()
    monitor = stepscope.performance_monitor(model, out_dir=str(out), **options)
    step = monitor(train_step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        losses = [step() for _ in range(steps)]
        monitor.close()
    return monitor, losses, [str(w.message) for w in caught if issubclass(w.category, StepscopeWarning)]


def traces(out: Path) -> list[str]:
    return sorted(a.path for run in out.iterdir() for a in read_manifest(run).artifacts if a.kind == "trace")


@pytest.mark.slow
def test_two_monitors_in_one_process_second_records_nothing(tmp_path: Path) -> None:
    # GIVEN two monitors entered together (and a third on a decorated function)
    done = run_job(
        tmp_path,
        """
        opts = dict(wait=1, warmup=1, active=2, console=False)
        m1 = stepscope.performance_monitor(model, out_dir="a", **opts)
        m2 = stepscope.performance_monitor(model, out_dir="b", **opts)
        m3 = stepscope.performance_monitor(model, out_dir="c", **opts)
        decorated = m3(step)
        with m1, m2:
            for _ in range(8):
                step(); decorated(); m1.step(); m2.step()
        m3.close()
        print("trained", flush=True)
        """,
    )
    # THEN the job ends normally, the first monitor wrote its window, the others said why they record nothing
    assert done.returncode == 0, done.stderr[-2000:]
    assert "trained" in done.stdout and "user atexit ran" in done.stdout
    assert traces(tmp_path / "a") == ["traces/rank0_step3.json.gz"]
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()
    assert done.stderr.count("another monitor is already recording in this process") == 2


@pytest.mark.slow
def test_monitor_inside_the_users_own_profiler_leaves_it_alone(tmp_path: Path) -> None:
    # GIVEN a job that runs its own torch.profiler around a monitor
    done = run_job(
        tmp_path,
        """
        m = stepscope.performance_monitor(model, out_dir="out", wait=1, warmup=1, active=2, console=False)
        with torch.profiler.profile() as mine:
            s = m(step)
            for _ in range(6):
                s()
        m.close()
        print("own profiler events:", len(mine.key_averages()), flush=True)
        """,
    )
    # THEN the job ends normally with its own profile intact; stepscope says its traces are off
    assert done.returncode == 0, done.stderr[-2000:]
    assert "own profiler events: 0" not in done.stdout and "own profiler events:" in done.stdout
    assert "another torch.profiler is recording in this process" in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.8, 1.3, 1.8, 2.3])
def test_ctrl_c_at_any_moment_ends_like_a_ctrl_c(tmp_path: Path, delay: float) -> None:
    # GIVEN a job that records a window every two steps, forever, and gets a real SIGINT after `delay` s
    # (before the fix, 7 of 10 such runs died of SIGSEGV at exit, their atexit handlers not run)
    done = run_job(
        tmp_path,
        f"""
        import threading
        m = stepscope.performance_monitor(model, out_dir="out", wait=0, warmup=1, active=1, repeat=0, console=False)
        s = m(step)
        threading.Timer({delay}, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        while True:
            s()
        """,
    )
    # THEN it stops with KeyboardInterrupt, as it would without stepscope: no other signal (Python itself ends by
    # SIGINT, -2, once a KeyboardInterrupt leaves the script; 1 or 130 where it is raised on the way out), its
    # atexit handler ran
    assert done.returncode in (1, 130, -signal.SIGINT), (done.returncode, done.stderr[-2000:])
    assert "KeyboardInterrupt" in done.stderr and "user atexit ran" in done.stdout


@pytest.mark.slow
def test_ctrl_c_inside_the_step_range_enter_ends_like_a_ctrl_c(tmp_path: Path) -> None:
    # GIVEN a job whose Ctrl-C lands inside torch's record_function.__enter__ for a ProfilerStep, after torch's
    # op started the range but before the handle was kept (the race behind 1 in about 50 real Ctrl-Cs, which
    # then died of SIGSEGV at exit: the collector failed in close and left the profiler running)
    done = run_job(
        tmp_path,
        """
        from torch.autograd import profiler as tp
        enter = tp.record_function.__enter__
        def interrupted(self):
            if self.name == "ProfilerStep#2":  # the second step of the active window
                torch.ops.profiler._record_function_enter_new(self.name, self.args)
                raise KeyboardInterrupt
            return enter(self)
        tp.record_function.__enter__ = interrupted
        m = stepscope.performance_monitor(model, out_dir="out", wait=0, warmup=1, active=2, repeat=0, console=False)
        s = m(step)
        while True:
            s()
        """,
    )
    # THEN it stops with KeyboardInterrupt, no signal, its atexit handler ran, stepscope did not fail
    assert done.returncode in (1, 130), (done.returncode, done.stderr[-2000:])
    assert "KeyboardInterrupt" in done.stderr and "user atexit ran" in done.stdout
    assert "collector failed" not in done.stderr
    assert traces(tmp_path / "out") == ["traces/rank0_step1.json.gz"]  # the window so far, exported


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"RANK": "abc", "WORLD_SIZE": "2"}, "RANK='abc' is not an integer"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE='0' is not an integer >= 1"),
        ({"RANK": "5", "WORLD_SIZE": "2"}, "RANK=5 is not below WORLD_SIZE=2"),
    ],
)
@pytest.mark.slow
def test_bad_rank_environment_profiles_as_rank_0_with_a_warning(
    tmp_path: Path, env: dict[str, str], problem: str
) -> None:
    done = run_job(
        tmp_path,
        short_run(active=1),
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert problem in done.stderr and "profiles as rank 0 of 1" in done.stderr
    assert traces(tmp_path / "out") == ["traces/rank0_step1.json.gz"]


def test_failing_summary_costs_no_trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN the child that summarises each window failing (and torch's key_averages too, which is never called)
    import torch

    from stepscope.capture.window import child

    def broken(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")

    monkeypatch.setattr(torch.profiler.profile, "key_averages", broken)
    monkeypatch.setattr(child, "CHILD_COMMAND", (sys.executable, "-c", "raise SystemExit(1)"))
    # WHEN four windows are recorded
    _, _, messages = train_and_close(tmp_path, 8, wait=0, warmup=1, active=1, repeat=4, console=True)
    # THEN all four traces are written, and one warning says the summaries are off
    assert len(traces(tmp_path)) == 4
    assert len(messages) == 1 and "summaries and the console table are off" in messages[0], messages


@pytest.mark.slow
def test_region_names_with_markup_are_printed_as_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train_step, model = make_training()
    with stepscope.performance_monitor(
        model, out_dir=str(tmp_path), wait=0, warmup=1, active=2, repeat=2
    ) as monitor:
        for _ in range(6):
            with monitor.region("loss[/]"), monitor.region("[bold]fwd[/bold]"):
                train_step()
            monitor.step()
    assert len(traces(tmp_path)) == 2
    out = capsys.readouterr().err  # the monitor prints on stderr
    assert "loss[/]" in out and "[bold]fwd[/bold]" in out


@pytest.mark.slow
def test_a_kill_during_export_leaves_no_system_temp_file_and_the_traces_folder_loads(tmp_path: Path) -> None:
    # GIVEN a job killed in the middle of its second window's export (the JSON written, not yet packed), once the
    # first window's worker has written its trace
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    done = run_job(
        tmp_path,
        """
        inner = torch.autograd.profiler.profile.export_chrome_trace
        calls = []
        def export_then_die(self, *args, **kwargs):
            result = inner(self, *args, **kwargs)
            calls.append(1)
            if len(calls) == 2:
                os._exit(9)
            return result
        torch.autograd.profiler.profile.export_chrome_trace = export_then_die
        m = stepscope.performance_monitor(model, out_dir="out", wait=0, warmup=1, active=1, repeat=2, console=False)
        s = m(step)
        import glob, time
        for i in range(4):
            s()
            while i == 1 and not glob.glob("out/*/traces/rank0_step1.json.gz"):
                time.sleep(0.02)
        """,
        env={"TMPDIR": str(tmp)},
    )
    assert done.returncode == 9, done.stderr[-2000:]
    # THEN the system temp folder holds no trace JSON (torch's own caches may appear there)
    assert [p.name for p in tmp.rglob("*.json*")] == []
    # AND the traces folder loads: the first window's trace, the second window's temp files skipped
    (run,) = (tmp_path / "out").iterdir()
    names = sorted(p.name for p in (run / "traces").iterdir())
    assert (
        names[-1] == "rank0_step1.json.gz" and all(n.startswith(".") for n in names[:-1]) and len(names) > 1
    )
    assert cli_main(["summary", str(run / "traces"), "--json"]) == 0


@pytest.mark.slow
def test_metrics_that_fail_to_flush_switch_metrics_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stepscope.capture.output.writer import RunWriter

    def broken(self: RunWriter) -> None:
        raise ValueError("disk says no")

    monkeypatch.setattr(RunWriter, "flush_metrics", broken)
    _, losses, messages = train_and_close(tmp_path, 5, wait=0, warmup=1, active=1, repeat=2, console=False)
    assert len(losses) == 5 and len(traces(tmp_path)) == 2
    assert messages == [
        "stepscope: cannot write metrics.jsonl (ValueError: disk says no); step metrics are switched off, "
        "training goes on"
    ]


@pytest.mark.slow
def test_stacks_with_memory_logging_write_every_window(tmp_path: Path) -> None:
    # GIVEN with_stack=True and memory logging every 5 steps over 30 windows (once 1 of 30 windows survived)
    train_step, model = make_training()
    monitor = stepscope.performance_monitor(
        model,
        out_dir=str(tmp_path),
        wait=0,
        warmup=1,
        active=1,
        repeat=30,
        with_stack=True,
        memory_log_every=5,
        console=False,
    )
    step = monitor(train_step)
    for _ in range(60):
        step()
    monitor.close()
    # THEN 30 traces
    assert len(traces(tmp_path)) == 30


HOSTILE_NAMES = ("evil\x1b[2J\x1b]0;pwned\x07op", "[/bold]", "[link=http://evil.example]click[/link]")


@pytest.mark.parametrize("command", ["summary", "analyze", "diff"])
def test_names_from_a_trace_never_drive_the_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    # GIVEN a trace whose op and kernel names carry escape sequences and rich markup, in a folder named with markup
    from ..support.traces import cpu, launched, step, write_trace

    def events(names: tuple[str, ...]) -> list[dict[str, Any]]:
        out = [step(0, 0, 1000)]
        for i, name in enumerate(names):
            out += [cpu(name, 10 + 300 * i, 100)]
            out += launched(name, 20 + 300 * i, 200 + 300 * i, 50, corr=i + 1)
        return out

    path = write_trace(tmp_path / "[bold]runs[/bold]" / "rank0.json", events(HOSTILE_NAMES), rank=0)
    other = write_trace(tmp_path / "other" / "rank0.json", events(HOSTILE_NAMES[1:2]), rank=0)
    # WHEN a report is printed (diff: the names are only in the base)
    assert cli_main([command, str(path)] + ([str(other)] if command == "diff" else [])) == 0
    out = capsys.readouterr().out
    # THEN no control character reaches the terminal; escapes and brackets are shown as written
    assert not any(c in out for c in "\x1b\x07\x9b")
    assert "[bold]runs[/bold]" in out and "[link=" in out and "evil\\x1b[2" in out


def _memo_bomb() -> bytes:
    import pickle

    frames = [{"filename": "a.py", "line": 1, "name": "f"}] * 2000
    entry = {"action": "alloc", "addr": 1, "size": 8, "frames": frames}
    return pickle.dumps({"segments": [], "device_traces": [[entry] * 2000] * 2000}, protocol=4)


def _pickled(obj: Any) -> bytes:
    import pickle

    return pickle.dumps(obj)


def _cycle() -> bytes:
    loop: list[Any] = [1]
    loop.append(loop)
    return _pickled({"segments": [], "device_traces": [loop]})


MEMORY_CASES = {
    "bomb.pickle": (_memo_bomb, "holds more than"),
    "cycle.pickle": (_cycle, "holds itself"),
    "deep.json": (lambda: b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    "huge.pickle": (
        lambda: _pickled({"segments": [{"total_size": 2**63, "blocks": []}], "device_traces": []}),
        "segments[0].total_size",
    ),
    "nan.pickle": (
        lambda: _pickled({"device_traces": [[{"action": "alloc", "size": 8, "time_us": float("nan")}]]}),
        "time_us",
    ),
    "inf.pickle": (
        lambda: _pickled({"device_traces": [[{"action": "alloc", "size": 8, "time_us": float("inf")}]]}),
        "time_us",
    ),
    "wrap.json": (lambda: json_bytes([[i, 1, 2**61, 1] for i in range(3)]), "add up past 2**62"),
    "latin1.json": (lambda: b'[{"a": "\xff\xfe"}]', "not UTF-8"),
    "over_limit.gz": (lambda: gzip_bytes(b"\x80\x04(" + b"K\x01" * (3 << 19)), "inflates to more than"),
}


def json_bytes(obj: Any) -> bytes:
    import json

    return json.dumps(obj).encode()


def gzip_bytes(data: bytes) -> bytes:
    import gzip

    return gzip.compress(data)


@pytest.mark.parametrize("name", sorted(MEMORY_CASES))
def test_hostile_memory_files_end_with_one_line_and_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    # GIVEN a hostile or broken memory file (the input limit lowered to 2 MiB for the gzip case)
    monkeypatch.setenv("STEPSCOPE_MAX_INPUT_BYTES", str(2 << 20))
    make, problem = MEMORY_CASES[name]
    path = tmp_path / name
    path.write_bytes(make())
    # WHEN `stepscope memory` reads it
    status = cli_main(["memory", str(path)])
    # THEN exit 2 and one line naming the file and the problem
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1, err
    assert str(path) in err and problem in err, err


@pytest.mark.parametrize("kind", ["fifo", "device", "folder"])
def test_memory_refuses_what_is_not_a_regular_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    path = {"device": Path("/dev/zero"), "folder": tmp_path}.get(kind, tmp_path / "fifo")
    if kind == "fifo":
        os.mkfifo(path)
    assert cli_main(["memory", str(path)]) == 2  # a FIFO would wait for a writer, /dev/zero never end
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ("not a regular file" in err or "a folder" in err), err


def _trace_text(events: str) -> bytes:
    return ('{"traceEvents":[' + events + "]}").encode()


TRACE_CASES = {
    "deep_args.json": (
        _trace_text('{"name":"a","ph":"X","ts":1,"dur":1,"args":{"x":' + "[" * 5000 + "]" * 5000 + "}}"),
        "JSON nested too deeply",
    ),
    "far_future.json": (
        _trace_text('{"name":"aten::mm","ph":"X","cat":"cpu_op","ts":9e15,"dur":9e15,"pid":1,"tid":1}'),
        "a ts beyond 2**62 ns",
    ),
}


@pytest.mark.parametrize("name", sorted(TRACE_CASES))
def test_hostile_traces_end_with_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    data, problem = TRACE_CASES[name]
    path = tmp_path / name
    path.write_bytes(data)
    assert cli_main(["analyze", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and problem in err, err


def test_a_step_number_beyond_int64_is_not_a_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ..support.traces import cpu, step, write_trace

    events = [step(1, 0, 100), cpu("ProfilerStep#9223372036854775808", 200, 50, cat="user_annotation")]
    events += [cpu("aten::mm", 10, 20)]
    path = write_trace(tmp_path / "t.json", events, rank=0)
    assert cli_main(["analyze", str(path), "--json"]) == 0
    import json as _json

    (rank,) = _json.loads(capsys.readouterr().out)["ranks"]
    assert rank["window"]["total_steps"] == 1


def test_a_manifest_that_is_not_utf8_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "manifest.json").write_bytes(b'{"schema": "stepscope.manifest/1", "run_name": "\xff"}')
    assert cli_main(["analyze", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not UTF-8" in err, err


def _timed_cli(
    args: list[str], env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], float, int]:
    """`stepscope ARGS` in a child process: (result, wall seconds, peak RSS of the child in KiB)."""
    import resource
    import time

    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "stepscope", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return done, time.perf_counter() - t0, peak if peak > before else 0


@pytest.mark.slow
def test_a_long_stretch_without_an_event_boundary_loads_in_linear_time(tmp_path: Path) -> None:
    import gzip

    # GIVEN one event whose string arg is 64 MB long (no cut spot in it: once 21 s, quadratic)
    text = b'{"traceEvents":[{"name":"a","ph":"X","ts":1,"dur":1,"args":{"s":"' + b"x" * (64 << 20) + b'"}}]}'
    path = tmp_path / "long.json.gz"
    path.write_bytes(gzip.compress(text, 1))
    # WHEN summarised
    done, seconds, _ = _timed_cli(["summary", str(path), "--json"])
    # THEN it loads, in well under the old time (generous for a loaded CI machine)
    assert done.returncode == 0, done.stderr
    assert seconds < 8, seconds


@pytest.mark.slow
def test_a_gzip_of_zeros_is_refused_at_once_in_bounded_memory(tmp_path: Path) -> None:
    import zlib

    # GIVEN 4 MB of gzip that inflates to 4 GiB of zeros (written in pieces, never held inflated)
    path = tmp_path / "zeros.json.gz"
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = b"\0" * (64 << 20)
    with open(path, "wb") as fh:
        for _ in range(64):
            fh.write(packer.compress(block))
        fh.write(packer.flush())
    # WHEN analysed
    done, seconds, peak_kib = _timed_cli(["analyze", str(path)])
    # THEN one line and exit 2, quickly, without inflating it
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "not valid JSON" in done.stderr and seconds < 10
    assert peak_kib < 1 << 20  # under 1 GiB


def test_a_trace_over_the_input_limit_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gzip

    from ..support.traces import cpu, write_trace

    path = write_trace(tmp_path / "t.json", [cpu(f"op{i}", i * 10, 5) for i in range(2000)], rank=0)
    packed = tmp_path / "t.json.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    monkeypatch.setenv("STEPSCOPE_MAX_INPUT_BYTES", "50000")
    for target, problem in ((path, "larger than the input limit"), (packed, "inflates to more than 50000")):
        with pytest.raises(InputError, match=problem):
            load_trace(target)


def test_an_error_while_profiling_starts_switches_it_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stepscope.capture import startup

    def broken(config: Any, **kwargs: Any) -> Any:
        raise RuntimeError("no collectors today")

    monkeypatch.setattr(startup, "collector_classes", broken)
    monitor, losses, messages = train_and_close(tmp_path, 3, wait=0, warmup=1, active=1)
    assert len(losses) == 3 and not monitor.recording
    assert messages == [
        "stepscope: profiling could not start (RuntimeError: no collectors today); it is switched off for this "
        "run, training goes on"
    ]


def test_a_folder_that_cannot_be_listed_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # (root reads every folder, so the permission error is simulated)
    def denied(self: Path) -> Any:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "iterdir", denied)
    assert cli_main(["summary", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == f"stepscope: error: {tmp_path}: cannot read: Permission denied\n"


def test_event_count_and_name_length_have_limits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ..support.traces import cpu, write_trace

    many = write_trace(tmp_path / "many.json", [cpu(f"op{i}", i * 10, 5) for i in range(2000)], rank=0)
    monkeypatch.setenv("STEPSCOPE_MAX_EVENTS", "100")
    with pytest.raises(InputError, match="more than 100 events"):
        load_trace(many)
    monkeypatch.delenv("STEPSCOPE_MAX_EVENTS")
    load_trace(many)  # within the default limit
    long_name = write_trace(tmp_path / "long.json", [cpu("x" * ((1 << 20) + 1), 0, 5)], rank=0)
    with pytest.raises(InputError, match="an event name of 1048577 characters"):
        load_trace(long_name)


def test_memory_report_prints_hostile_names_as_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import pickle

    frames = [{"filename": "evil\x1b[2J[/bold].py", "line": 1, "name": "[link=http://evil.example]f[/link]"}]
    block = {"size": 512, "address": 1, "state": "active_allocated", "frames": frames}
    snap = {"segments": [{"device": 0, "total_size": 4096, "blocks": [block]}], "device_traces": []}
    folder = tmp_path / "[bold]snaps[/bold]"  # (a folder inside a folder: the name holds a slash)
    folder.mkdir(parents=True)
    (folder / "s.pickle").write_bytes(pickle.dumps(snap))
    assert cli_main(["memory", str(folder / "s.pickle")]) == 0
    out = capsys.readouterr().out
    # (a long path is folded at the console width: compare without the line breaks)
    assert (
        "\x1b" not in out
        and "[bold]snaps[/bold]" in out.replace("\n", "")
        and "evil\\x1b[2J[/bold].py" in out.replace("\n", "")
    )


def test_the_cli_reads_files_itself_instead_of_asking_click(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # click's own readability check printed a three-line usage error; stepscope reports unreadable files in one
    # line through its own path. Here: click would say "not readable" (os.access is faked), stepscope reads.
    from ..support.traces import cpu, write_trace

    path = write_trace(tmp_path / "t.json", [cpu("aten::mm", 0, 5)], rank=0)
    monkeypatch.setattr(os, "access", lambda *args, **kwargs: False)
    for command in (["summary", str(path)], ["analyze", str(path)], ["diff", str(path), str(path)]):
        assert cli_main(command) == 0, capsys.readouterr().err
