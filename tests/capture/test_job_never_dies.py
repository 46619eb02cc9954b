"""The training job never dies or hangs because of stepscope (issue #34: steps from several threads, warnings as
errors, a closed stdout/stderr, a burst of SIGUSR2, a framework logger that rejects our numbers, a huge
WORLD_SIZE). Each case is a real job in a process of its own."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from stepscope.cli import main as cli_main
from stepscope.runfolder import read_manifest

from ..support.output import profiler_steps

REPO = Path(__file__).resolve().parents[2]
PRELUDE = f"""
import os, sys, threading, time
sys.path.insert(0, {str(REPO)!r})
import torch
import stepscope
from tests.support.train import make_training
"""
THREADS_WARNING = "steps end on more than one thread"


def job_script(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "job.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    return script


def run_job(
    tmp_path: Path, body: str, env: dict[str, str] | None = None, flags: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    script = job_script(tmp_path, body)
    return subprocess.run(
        [sys.executable, *flags, str(script)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )


def only_run(out: Path) -> Path:
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return run_dir


def metric_steps(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# --- 1. steps from more than one thread ---------------------------------------------------------------------
@pytest.mark.slow
def test_steps_taking_turns_on_four_threads_profile_the_first_threads_steps(tmp_path: Path) -> None:
    # GIVEN a decorated step called from 4 threads in turn (serialised: one shared model), 6 steps each;
    # the thread that calls first starts the monitor (before the fix: SIGSEGV, "External init callback must run
    # in same thread as registerClient": the profiler was started on one thread and stopped on another)
    done = run_job(
        tmp_path,
        """
        step, model = make_training()
        m = stepscope.performance_monitor(model, out_dir="out", wait=1, warmup=1, active=8, console=False,
                                          report=False)
        s = m(step)
        turn = threading.Condition()
        state = {"turn": 0}

        def work(i):
            for _ in range(6):
                with turn:
                    turn.wait_for(lambda: state["turn"] % 4 == i)
                    s()
                    state["turn"] += 1
                    turn.notify_all()

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads: t.start()
        for t in threads: t.join()
        m.close()
        print("steps", m.steps_done, flush=True)
        """,
    )
    # THEN the job ends normally, says once why the other threads' steps are not traced
    assert done.returncode == 0, done.stderr[-3000:]
    assert "steps 24" in done.stdout
    assert done.stderr.count(THREADS_WARNING) == 1
    # AND what it wrote is readable: every step in the metrics, and a window of the first thread's steps
    # (steps 0, 4, 8, ...: warmup at 1, active 2-9, so its steps begun at 5 and 9 are in the trace)
    run_dir = only_run(tmp_path / "out")
    assert metric_steps(run_dir) == list(range(24))
    (trace,) = read_manifest(run_dir).of_kind("trace")
    assert trace.path == "traces/rank0_step9.json.gz"
    assert profiler_steps(run_dir / trace.path) == [5, 9]
    assert cli_main(["analyze", str(run_dir)]) == 0


@pytest.mark.parametrize("how", ["its thread ends", "closed on another thread"])
@pytest.mark.slow
def test_a_window_left_open_on_its_thread_is_dropped_without_a_crash(tmp_path: Path, how: str) -> None:
    # GIVEN a window open on the thread that started the monitor when that thread ends (the main thread steps on
    # and closes), or when the monitor is closed on another thread (before: SIGSEGV at exit, exit 139: the
    # profiler was left running, and only its own thread can stop it)
    body = {
        "its thread ends": """
        t = threading.Thread(target=lambda: [s() for _ in range(4)], name="owner"); t.start(); t.join()
        for _ in range(4): s()
        m.close()
        """,
        "closed on another thread": """
        for _ in range(4): s()
        c = threading.Thread(target=m.close, name="closer"); c.start(); c.join()
        """,
    }[how]
    head = """
        step, model = make_training()
        m = stepscope.performance_monitor(model, out_dir="out", wait=0, warmup=1, active=10, repeat=1,
                                          console=False, report=False)
        s = m(step)
        """
    done = run_job(tmp_path, textwrap.dedent(head) + textwrap.dedent(body) + 'print("done", flush=True)\n')
    # THEN the job ends normally; the window is dropped, with a warning saying so
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == "done\n"
    assert "that window is dropped" in done.stderr
    assert metric_steps(only_run(tmp_path / "out")) == list(range(8 if how == "its thread ends" else 4))


@pytest.mark.slow
def test_steps_of_four_threads_at_once_under_a_context_monitor_never_crash(tmp_path: Path) -> None:
    # GIVEN `with monitor:` on the main thread and 4 threads, each training its own model, calling
    # monitor.step() at the same time, no lock; the first window begins on the main thread
    done = run_job(
        tmp_path,
        """
        m = stepscope.performance_monitor(out_dir="out", wait=0, warmup=1, active=3, repeat=2, console=False,
                                          report=False)

        def work(seed):
            step, _ = make_training(seed)
            for _ in range(10):
                step()
                m.step()

        with m:
            threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
            for t in threads: t.start()
            for t in threads: t.join()
        print("closed", flush=True)
        """,
    )
    # THEN the job ends normally with one warning, and its metrics are readable JSON lines
    assert done.returncode == 0, done.stderr[-3000:]
    assert "closed" in done.stdout
    assert done.stderr.count(THREADS_WARNING) == 1
    steps = metric_steps(only_run(tmp_path / "out"))
    assert steps and steps == sorted(steps)


# --- 2. warnings turned into errors -------------------------------------------------------------------------
FOUR_WARNINGS = """
step, model = make_training()
open("a_file", "w").close()
opts = dict(wait=0, warmup=1, active=2, console=False, report=False)
# an out_dir that is a file
m0 = stepscope.performance_monitor(model, out_dir="a_file", **opts)
s0 = m0(step)
for _ in range(3):
    s0()
m0.close()
# RANK=abc, two monitors, and a job shorter than its first window
os.environ["RANK"] = "abc"
m1 = stepscope.performance_monitor(model, out_dir="one", **opts)
m2 = stepscope.performance_monitor(model, out_dir="two", **opts)
with m1, m2:
    step(); m1.step(); m2.step()
print("trained", flush=True)
"""


@pytest.mark.parametrize("how", ["-W error", "PYTHONWARNINGS=error"])
@pytest.mark.slow
def test_stepscope_warnings_never_raise_into_a_job_that_turns_warnings_into_errors(
    tmp_path: Path, how: str
) -> None:
    # GIVEN a job run with warnings as errors that meets four of stepscope's warnings (before the fix: exit 1
    # with a traceback through monitor.py at the first of them)
    flags: tuple[str, ...] = ("-W", "error") if how == "-W error" else ()
    env = {"PYTHONWARNINGS": "error"} if how != "-W error" else {}
    done = run_job(tmp_path, FOUR_WARNINGS, env=env, flags=flags)
    # THEN it ends normally, each warning printed once on stderr
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trained" in done.stdout
    for message in (
        "cannot write the run folder a_file",
        "RANK='abc' is not an integer >= 0",
        "another monitor is already recording in this process",
        "the job ended after 1 step(s), before the first active window completed",
    ):
        assert done.stderr.count(message) == 1, (message, done.stderr[-3000:])
    assert "StepscopeWarning" in done.stderr and "Traceback" not in done.stderr
    # AND the monitor that could record did
    assert read_manifest(only_run(tmp_path / "one")).world_size == 1


# --- 3. a closed stdout and stderr --------------------------------------------------------------------------
@pytest.mark.slow
def test_a_job_whose_stdout_and_stderr_are_closed_pipes_ends_normally(tmp_path: Path) -> None:
    # GIVEN a job with the console table and the report on, whose stdout and stderr are pipes nobody reads
    # (`train.py 2>&1 | head` after head exited; before the fix: exit 1, BrokenPipeError or rich's SystemExit)
    script = job_script(
        tmp_path,
        """
        step, model = make_training()
        m = stepscope.performance_monitor(model, out_dir="out", wait=0, warmup=1, active=2, console=True)
        s = m(step)
        for _ in range(5):
            s()
        m.close()
        open("finished", "w").close()
        """,
    )
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    os.close(out_read)
    os.close(err_read)
    try:
        job = subprocess.Popen(
            [sys.executable, str(script)], stdout=out_write, stderr=err_write, cwd=tmp_path,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
    finally:
        os.close(out_write)
        os.close(err_write)
    # THEN it ends normally, its window and report written
    assert job.wait(timeout=240) == 0
    assert (tmp_path / "finished").is_file()
    run_dir = only_run(tmp_path / "out")
    assert [a.path for a in read_manifest(run_dir).of_kind("trace")] == ["traces/rank0_step2.json.gz"]
    assert (run_dir / "report.html").is_file()


# --- 5. a burst of SIGUSR2 ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_stream_of_sigusr2_never_kills_an_on_demand_job(tmp_path: Path) -> None:
    # GIVEN a job that runs two on-demand monitors one after the other, with a pause after each
    script = job_script(
        tmp_path,
        """
        step, model = make_training()
        for k in range(2):
            m = stepscope.performance_monitor(model, out_dir=f"out{k}", on_demand=True, trigger_poll_steps=2,
                                              warmup=1, active=2, console=False, report=False)
            with m:
                for _ in range(60):
                    step(); m.step(); time.sleep(0.005)
            time.sleep(0.3)
        print("done", flush=True)
        time.sleep(1)  # still running: the signals sent before the test saw "done" arrive now
        """,
    )
    job = subprocess.Popen(
        [sys.executable, str(script)], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    stop = threading.Event()
    sent = [0]

    def signal_stream() -> None:  # from the moment the job says it listens until it ends: one every 2 ms
        while not stop.is_set() and job.poll() is None:
            os.kill(job.pid, signal.SIGUSR2)
            sent[0] += 1
            time.sleep(0.002)

    try:
        deadline = time.monotonic() + 120
        while not glob.glob(str(tmp_path / "out0/*/.listening-rank0.json")):
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()[1][-3000:]
            time.sleep(0.001)
        # WHEN 50 SIGUSR2 come at once as soon as the listener file is there, then a stream of them, through
        # the close of the first monitor, the pause, and the second monitor (before the fix: killed by
        # signal 12 once the first monitor had put SIGUSR2's default action back)
        for _ in range(50):
            os.kill(job.pid, signal.SIGUSR2)
        sender = threading.Thread(target=signal_stream)
        sender.start()
        assert job.stdout is not None
        done = job.stdout.readline()
        # (Python itself puts the default action back as the interpreter finalizes: the stream stops before)
        stop.set()
        sender.join()
        _, err = job.communicate(timeout=240)
    finally:
        stop.set()
        if job.poll() is None:
            job.kill()
            job.communicate()
    # THEN the job ends normally, and each monitor recorded the windows the signals asked for
    assert job.returncode == 0, err[-3000:]
    assert done == "done\n" and sent[0] > 50
    for k in range(2):
        assert read_manifest(only_run(tmp_path / f"out{k}")).of_kind("trace")


@pytest.mark.slow
def test_sigusr2_never_kills_an_on_demand_job_whose_steps_run_on_a_worker_thread(tmp_path: Path) -> None:
    # GIVEN an on-demand monitor made on the main thread whose first step (so its start) runs on a worker
    # thread, where no signal handler can be installed (before: killed by signal 12 at the first SIGUSR2)
    script = job_script(
        tmp_path,
        """
        step, model = make_training()
        m = stepscope.performance_monitor(model, out_dir="out", on_demand=True, trigger_poll_steps=2,
                                          warmup=1, active=2, console=False, report=False)
        s = m(step)
        def work():
            for _ in range(80):
                s(); time.sleep(0.005)
        t = threading.Thread(target=work); t.start(); t.join()
        m.close()
        print("done", flush=True)
        """,
    )
    job = subprocess.Popen(
        [sys.executable, str(script)], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not glob.glob(str(tmp_path / "out/*/.listening-rank0.json")):
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()[1][-3000:]
            time.sleep(0.001)
        # WHEN a burst of SIGUSR2 comes as soon as the job says it listens
        for _ in range(20):
            os.kill(job.pid, signal.SIGUSR2)
            time.sleep(0.002)
        out, err = job.communicate(timeout=240)
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
    # THEN the job ends normally and records the window the signals asked for
    assert job.returncode == 0, err[-3000:]
    assert out == "done\n"
    assert read_manifest(only_run(tmp_path / "out")).of_kind("trace")


# --- 7b. a framework logger that rejects our numbers --------------------------------------------------------
REJECTING = """
def rejects(metrics):
    if any(key.startswith("stepscope/") for key in metrics):
        raise ValueError("metric names may not contain '/'")
"""


@pytest.mark.slow
def test_a_lightning_logger_that_rejects_our_numbers_costs_one_warning(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    # GIVEN a Lightning fit with two windows whose CSV logger raises on stepscope's keys (before: fit() ended
    # with exit 1 at the first window's headline)
    done = run_job(
        tmp_path,
        REJECTING
        + """
        import lightning as L
        from lightning.pytorch.loggers import CSVLogger
        from stepscope.integrations.lightning import StepscopeCallback

        class Rejecting(CSVLogger):
            def log_metrics(self, metrics, step=None):
                rejects(metrics)
                super().log_metrics(metrics, step)

        class Regression(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.net = torch.nn.Linear(8, 1)
            def training_step(self, batch, batch_idx):
                loss = torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])
                self.log("loss", loss)
                return loss
            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.01)

        data = torch.utils.data.TensorDataset(torch.randn(96, 8), torch.randn(96, 1))
        callback = StepscopeCallback(wait=1, warmup=1, active=2, repeat=2, console=False, report=False)
        trainer = L.Trainer(max_steps=12, accelerator="cpu", logger=Rejecting("logs"), log_every_n_steps=1,
                            enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
                            callbacks=[callback])
        trainer.fit(Regression(), torch.utils.data.DataLoader(data, batch_size=8))
        print("fit done", flush=True)
        """.replace("\n        ", "\n"),
    )
    # THEN fit() ends normally; one warning; the logger still got the job's own metrics; both windows recorded
    assert done.returncode == 0, done.stderr[-3000:]
    assert "fit done" in done.stdout
    assert done.stderr.count("metric names may not contain") == 1
    (csv_file,) = list((tmp_path / "logs").rglob("metrics.csv"))
    assert "loss" in csv_file.read_text().splitlines()[0]
    run_dir = only_run(tmp_path / "stepscope")
    assert len(read_manifest(run_dir).of_kind("trace")) == 2


@pytest.mark.slow
def test_an_hf_callback_that_rejects_our_numbers_costs_one_warning(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    # GIVEN a Trainer with two windows and a callback of the user's whose on_log raises on stepscope's keys
    # (before: train() ended with exit 1 at the first window's headline)
    done = run_job(
        tmp_path,
        REJECTING
        + f"""
        sys.path.insert(0, {str(REPO / "examples")!r})
        from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
        from hf_trainer import RandomTokens
        from stepscope.integrations.hf import StepscopeCallback

        class Rejecting(TrainerCallback):
            seen = []
            def on_log(self, args, state, control, logs=None, **kwargs):
                rejects(logs)
                self.seen.append(dict(logs))

        args = TrainingArguments(output_dir="hf", max_steps=10, per_device_train_batch_size=2, logging_steps=1,
                                 report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True)
        callback = StepscopeCallback(wait=1, warmup=1, active=2, repeat=2, console=False, report=False)
        config = GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=128, n_positions=32)
        trainer = Trainer(model=GPT2LMHeadModel(config), args=args, train_dataset=RandomTokens(20),
                          callbacks=[Rejecting(), callback])
        trainer.train()
        print("logged", sum("loss" in logs for logs in Rejecting.seen), flush=True)
        """.replace("\n        ", "\n"),
    )
    # THEN train() ends normally; one warning; the user's callback saw every log (without our keys)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "logged 10" in done.stdout
    assert done.stderr.count("metric names may not contain") == 1
    run_dir = only_run(tmp_path / "hf" / "stepscope")
    assert len(read_manifest(run_dir).of_kind("trace")) == 2


# --- 7c. WORLD_SIZE from the environment -------------------------------------------------------------------
@pytest.mark.slow
def test_a_huge_world_size_in_the_environment_costs_nothing(tmp_path: Path) -> None:
    # GIVEN WORLD_SIZE=100000000 without a process group, every rank profiled (before: 12.5 GB and 154 s for
    # a job of 2.6 s: a list of every rank, and a manifest of 100 million of them)
    done = run_job(
        tmp_path,
        """
        import resource
        began = time.monotonic()
        step, model = make_training()
        m = stepscope.performance_monitor(model, out_dir="out", wait=0, warmup=1, active=2,
                                          profiled_ranks="all", console=False, report=False)
        s = m(step)
        for _ in range(5):
            s()
        m.close()
        print("seconds", round(time.monotonic() - began), flush=True)
        print("peak MB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024, flush=True)
        """,
        env={"WORLD_SIZE": "100000000", "RANK": "0"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # THEN it ends in bounded memory (a CPU torch job: a few hundred MB) with the run folder of rank 0
    peak_mb = int(done.stdout.split("peak MB")[1])
    seconds = int(done.stdout.split("seconds")[1].split()[0])
    assert peak_mb < 1500 and seconds < 60, done.stdout
    manifest = read_manifest(only_run(tmp_path / "out"))
    assert manifest.world_size == 100_000_000
    assert manifest.profiled_ranks == [0]  # the ranks that recorded, not the environment's number
    assert [a.path for a in manifest.of_kind("trace")] == ["traces/rank0_step2.json.gz"]
