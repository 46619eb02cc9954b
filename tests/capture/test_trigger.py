"""On-demand windows: a job started with on_demand=True records nothing until `stepscope trigger` (or SIGUSR2)
asks; then every profiled rank records one window, from the same step."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from stepscope.runfolder import is_run_folder, read_manifest

from ..support.jobs import TORCH_EXIT_ABORT
from ..support.output import profiler_steps

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def start(cmd: list[str], cwd: Path) -> subprocess.Popen[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1")
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_run_folder(out: Path, job: subprocess.Popen[str], timeout: float = 120) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = [p for p in out.iterdir() if is_run_folder(p)] if out.is_dir() else []
        if runs and read_manifest(runs[0]).profiled_ranks:
            return runs[0]
        assert job.poll() is None, job.communicate()[1][-3000:]
        time.sleep(0.1)
    raise AssertionError(f"no run folder in {out}")


def test_trigger_records_one_window_on_every_rank_at_the_same_step(tmp_path: Path) -> None:
    for attempt in range(2):
        run_dir, code, err = _triggered_job(tmp_path / f"runs{attempt}")
        if code == 0 or TORCH_EXIT_ABORT not in err or attempt:
            break
        # torch's gloo abort at exit (docs/reliability.md): the job is run again, the first death a warning
        warnings.warn(
            f"a rank died of torch's abort at exit (run again):\n{err[-2000:]}", RuntimeWarning, stacklevel=1
        )
    assert code == 0, err[-3000:]
    traces = sorted((a.rank, a.step) for a in read_manifest(run_dir).of_kind("trace"))
    # exactly one window per rank, ending at the same step, with the --active 3 the trigger asked for
    assert [rank for rank, _ in traces] == [0, 1]
    assert traces[0][1] == traces[1][1]
    last = traces[0][1]
    for rank in (0, 1):
        assert profiler_steps(run_dir / f"traces/rank{rank}_step{last}.json.gz") == [last - 2, last - 1, last]
    # the request is gone once the window was recorded: the next one can be made
    assert not (run_dir / "trigger.json").exists()
    # and once the job ended, so are the ranks' claim of it and the manifest's lock
    assert [p.name for p in run_dir.iterdir() if p.name.startswith(".")] == []


def _triggered_job(out: Path) -> tuple[Path, int, str]:
    """A 2-rank job of examples/plain_train.py on demand, asked for one window by `stepscope trigger` once its
    run folder is there: the run folder, the job's exit status and its stderr."""
    job = start(
        [
            sys.executable,
            "-m",
            "stepscope",
            "run",
            "--nproc-per-node",
            "2",
            "--on-demand",
            "--trigger-poll-steps",
            "5",
            "--warmup",
            "1",
            "--active",
            "2",
            "--profiled-ranks",
            "all",
            "--no-console",
            "--no-report",
            "--out-dir",
            str(out),
            str(EXAMPLES / "plain_train.py"),
            "--steps",
            "300",
            "--sleep",
            "0.02",
        ],
        out.parent,
    )
    try:
        run_dir = wait_for_run_folder(out, job)
        assert not read_manifest(run_dir).of_kind("trace")  # waiting records nothing
        trigger = subprocess.run(
            [sys.executable, "-m", "stepscope", "trigger", str(out), "--active", "3", "--wait", "60"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert trigger.returncode == 0, trigger.stdout + trigger.stderr
        assert "window recorded" in trigger.stdout
    finally:
        _, err = job.communicate(timeout=240)
    return run_dir, job.returncode, err


def test_sigusr2_asks_for_a_window(tmp_path: Path) -> None:
    job = start(
        [
            sys.executable,
            str(EXAMPLES / "on_demand.py"),
            "--steps",
            "400",
            "--out-dir",
            str(tmp_path / "runs"),
        ],
        tmp_path,
    )
    try:
        assert job.stdout is not None
        line = job.stdout.readline()  # printed once the monitor has started (its handler is installed)
        assert line.startswith("run folder: "), line + job.communicate()[1][-3000:]
        run_dir = Path(line.removeprefix("run folder: ").strip())
        job.send_signal(signal.SIGUSR2)
        deadline = time.monotonic() + 60
        while not read_manifest(run_dir).of_kind("trace") and time.monotonic() < deadline:
            assert job.poll() is None, job.communicate()[1][-3000:]
            time.sleep(0.1)
    finally:
        job.terminate()
        job.communicate(timeout=60)
    (trace,) = read_manifest(run_dir).of_kind("trace")
    assert len(profiler_steps(run_dir / trace.path)) == 3  # examples/on_demand.py: active=3


def test_waiting_costs_one_stat_every_poll_interval(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import stepscope
    from stepscope.capture.window import trigger

    monitor = stepscope.performance_monitor(
        out_dir=str(tmp_path), on_demand=True, trigger_poll_steps=10, console=False, report=False
    )
    stats: list[str] = []
    real_stat = os.stat

    def counting_stat(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if str(path).endswith(trigger.TRIGGER_NAME):
            stats.append(str(path))
        return real_stat(path, *args, **kwargs)

    with monitor:
        monkeypatch.setattr(trigger.os, "stat", counting_stat)
        for _ in range(100):
            monitor.step()
    assert len(stats) == 10  # steps 0, 10, ..., 90
    assert not read_manifest(monitor.run_dir).of_kind("trace")
    assert any("no window was requested" in note for note in read_manifest(monitor.run_dir).notes)


def test_trigger_bad_input_is_one_line(tmp_path: Path) -> None:
    import stepscope

    plain = stepscope.performance_monitor(out_dir=str(tmp_path / "plain"), wait=0, warmup=0, active=1)
    with plain:
        plain.step()
    for target, problem in [
        (tmp_path / "nothing", "no such file or folder"),
        (plain.run_dir, "started with neither on_demand=True nor watch=True"),
        (tmp_path / "plain", "no run folder of an on-demand (on_demand=True) or watching"),
    ]:
        done = subprocess.run(
            [sys.executable, "-m", "stepscope", "trigger", str(target)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 2
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and problem in lines[0] and str(target) in lines[0]


def test_a_second_request_while_one_is_pending_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import stepscope
    from stepscope.cli import main

    monitor = stepscope.performance_monitor(
        out_dir=str(tmp_path), on_demand=True, console=False, report=False
    )
    with monitor:
        monitor.step()
        assert main(["trigger", str(monitor.run_dir)]) == 0
        assert "requested a window of 3 active step(s)" in capsys.readouterr().out
        assert main(["trigger", str(tmp_path), "--active", "5"]) == 1
        err = capsys.readouterr().err
        assert "a request is already pending" in err and str(monitor.run_dir / "trigger.json") in err


def test_a_finished_job_cannot_be_triggered(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import stepscope
    from stepscope.capture.window.trigger import read_listeners
    from stepscope.cli import main

    # GIVEN an on-demand job, which listens while it runs, and then finishes
    monitor = stepscope.performance_monitor(
        out_dir=str(tmp_path), on_demand=True, console=False, report=False
    )
    with monitor:
        monitor.step()
        assert [listener.pid for listener in read_listeners(monitor.run_dir)] == [os.getpid()]
    files = sorted(p.name for p in monitor.run_dir.iterdir())
    # WHEN it is triggered, by its run folder or by the folder that holds it
    for target in (monitor.run_dir, tmp_path):
        # THEN that is refused in one line naming the folder, and nothing is left in the run folder
        assert main(["trigger", str(target)]) == 2
        captured = capsys.readouterr()
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1 and str(target) in lines[0] and captured.out == ""
        assert "the job has finished" in lines[0] and "cannot record a window" in lines[0]
    assert sorted(p.name for p in monitor.run_dir.iterdir()) == files
    assert "trigger.json" not in files and not any(name.startswith(".listening") for name in files)


# A job that listens, polls once (at step 0, before any request), then either runs 3 s and ends, or is killed.
_SHORT_JOB = """
import os, signal, sys, time
import stepscope
monitor = stepscope.performance_monitor(
    out_dir=sys.argv[1], on_demand=True, trigger_poll_steps=10**6, console=False, report=False
)
with monitor:
    monitor.step()
    print(f"run folder: {monitor.run_dir}", flush=True)
    if sys.argv[2] == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    for _ in range(30):
        time.sleep(0.1)
        monitor.step()
"""


def test_a_killed_job_cannot_be_triggered(tmp_path: Path) -> None:
    # GIVEN a job killed while it listened (its listener file is left behind)
    done = subprocess.run(
        [sys.executable, "-c", _SHORT_JOB, str(tmp_path), "killed"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    run_dir = Path(done.stdout.removeprefix("run folder: ").strip())
    assert (run_dir / ".listening-rank0.json").is_file()
    # WHEN it is triggered THEN that is refused, naming the process that is gone, and no request is left
    trigger = subprocess.run(
        [sys.executable, "-m", "stepscope", "trigger", str(run_dir)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert trigger.returncode == 2, trigger.stdout + trigger.stderr
    assert "ended without closing its monitor (the processes of rank 0 pid" in trigger.stderr
    assert not (run_dir / "trigger.json").exists()


def test_a_job_that_ends_while_the_trigger_waits_takes_the_request_back(tmp_path: Path) -> None:
    # GIVEN a running job that will end without looking for requests again
    job = start([sys.executable, "-c", _SHORT_JOB, str(tmp_path), "ends"], tmp_path)
    try:
        assert job.stdout is not None
        run_dir = Path(job.stdout.readline().removeprefix("run folder: ").strip())
        # WHEN a trigger waits for its window
        trigger = subprocess.run(
            [sys.executable, "-m", "stepscope", "trigger", str(run_dir), "--wait", "60"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        job.communicate(timeout=60)
    # THEN it stops when the job ends, says so, and withdraws its request
    assert trigger.returncode == 1 and "requested a window" in trigger.stdout
    assert "the job has finished (no profiled rank listens" in trigger.stderr
    assert "before the window was recorded; the request is withdrawn" in trigger.stderr
    assert not (run_dir / "trigger.json").exists()


def test_a_request_for_a_billion_steps_is_bounded_and_the_job_ends(tmp_path: Path) -> None:
    # GIVEN an on-demand job of 40 no-op steps and a request file written by hand for 10^9 active steps
    import warnings

    import msgspec

    import stepscope
    from stepscope.capture.window.trigger import TRIGGER_NAME, TriggerRequest

    monitor = stepscope.performance_monitor(
        out_dir=str(tmp_path), on_demand=True, trigger_poll_steps=1, warmup=0, console=False, report=False
    )
    started = time.monotonic()
    with warnings.catch_warnings(record=True) as caught, monitor:
        warnings.simplefilter("always")
        monitor.step()
        request = TriggerRequest(id="bignumber123", requested=time.time(), active=10**9)
        (monitor.run_dir / TRIGGER_NAME).write_bytes(msgspec.json.encode(request))
        for _ in range(40):
            monitor.step()
    # THEN the job ran its steps at once, the request said bounded in one warning, and its window was recorded
    assert time.monotonic() - started < 60
    said = [str(w.message) for w in caught if "bignumber123" in str(w.message)]
    assert said == [
        "stepscope: on_demand: the request bignumber123 asks for 1,000,000,000 active steps; a window records 1 "
        "to 100,000: recording 100,000"
    ]
    assert read_manifest(monitor.run_dir).of_kind("trace")


def test_trigger_refuses_an_active_beyond_the_bound(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "stepscope", "trigger", str(tmp_path), "--active", "1000000"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "1000000 is not in the range 1<=x<=100000" in done.stderr


TEARDOWN_JOB = """
import sys, time
from pathlib import Path
import stepscope

class SlowTeardown:  # a module global: finalised after Python has disabled its signal handlers
    def __init__(self):
        self.marker, self.sleep = Path(sys.argv[2]), time.sleep

    def __del__(self):
        self.marker.write_text("tearing down")
        self.sleep(4)

keep = SlowTeardown()
monitor = stepscope.performance_monitor(out_dir=sys.argv[1], on_demand=True, console=False, report=False)
with monitor:
    for _ in range(5):
        monitor.step()
"""


def test_sigusr2_in_a_finished_jobs_teardown_does_not_kill_it(tmp_path: Path) -> None:
    # GIVEN an on-demand job that did its work and is tearing its interpreter down
    script = tmp_path / "job.py"
    script.write_text(TEARDOWN_JOB)
    marker = tmp_path / "teardown"
    job = start([sys.executable, str(script), str(tmp_path / "out"), str(marker)], tmp_path)
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert job.poll() is None and time.monotonic() < deadline, job.communicate()[1][-3000:]
        time.sleep(0.05)
    # WHEN a SIGUSR2 (what `stepscope trigger` may send) lands there
    job.send_signal(signal.SIGUSR2)
    _, err = job.communicate(timeout=60)
    # THEN the job exits 0, and no request is left behind in its run folder
    assert job.returncode == 0, err[-3000:]
    (run_dir,) = [p for p in (tmp_path / "out").iterdir() if p.is_dir()]
    assert not (run_dir / "trigger.json").exists()


@pytest.mark.parametrize("pid", [-1, 0])
def test_a_listener_file_with_an_impossible_pid_is_a_job_that_is_gone(tmp_path: Path, pid: int) -> None:
    # GIVEN a killed job's listener file, edited to name a pid no process can have
    import json

    done = subprocess.run(
        [sys.executable, "-c", _SHORT_JOB, str(tmp_path), "killed"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    run_dir = Path(done.stdout.removeprefix("run folder: ").strip())
    listener = run_dir / ".listening-rank0.json"
    listener.write_text(json.dumps({**json.loads(listener.read_text()), "pid": pid}))
    # WHEN it is triggered THEN that is refused in one line, as for any job that is gone
    trigger = subprocess.run(
        [sys.executable, "-m", "stepscope", "trigger", str(run_dir)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert trigger.returncode == 2 and len(trigger.stderr.strip().splitlines()) == 1, trigger.stderr
    assert f"rank 0 pid {pid}" in trigger.stderr


def test_a_command_with_its_output_closed_ends_without_a_traceback(tmp_path: Path) -> None:
    # GIVEN `stepscope analyze TRACE >&-` (Python then has no sys.stdout at all)
    from ..support.traces import step, write_trace

    path = write_trace(tmp_path / "t.json", [step(0, 0, 100)])
    for command in (["analyze"], ["analyze", "--json"], ["summary"]):
        done = subprocess.run(
            [sys.executable, "-m", "stepscope", command[0], str(path), *command[1:]],
            stdout=None, stderr=subprocess.PIPE, text=True, check=False, close_fds=True,
            preexec_fn=lambda: os.close(1),
        )  # fmt: skip
        assert done.returncode == 0 and "Traceback" not in done.stderr, (command, done.stderr[-2000:])
