"""Python sampling: py-spy records the training process's Python stacks during each active window.

py-spy runs as a child process (`py-spy record --pid <this process> --format raw --nonblocking --function
--threads`, SAMPLE_RATE_HZ samples a second, native frames off, idle threads left out), launched from a thread of
its own at the start of the window's first traced step (its warmup, so that py-spy, which takes some 40 ms to
attach, samples every active step) and stopped (SIGINT) at the end of the window's last active step:
the training thread pays for one signal per window, nothing per step. The thread reads py-spy's output, parses the
folded stacks and writes them as a PythonSamples payload (kind `python_samples`, one file per window).

Where py-spy is missing or may not attach (ptrace not permitted, as in containers without SYS_PTRACE), one warning
names the fix and the collector switches itself off; training goes on.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from stepscope.capture.collector import NEVER, Collector, RunContext
from stepscope.capture.console import StepscopeWarning, warn_user
from stepscope.runfolder import ArtifactKind
from stepscope.runfolder.payloads import PyFrame, PyStack, PythonSamples

SAMPLE_RATE_HZ = 100
PY_SPY_ENV = "STEPSCOPE_PY_SPY"  # the py-spy executable to run, where it is not beside Python or on PATH
STOP_TIMEOUT_S = 10.0  # how long py-spy may take to write its samples after SIGINT; then it is killed
PTRACE_FIX = (
    "allow ptrace: run the container with --cap-add SYS_PTRACE (docker) or securityContext.capabilities.add "
    "[SYS_PTRACE] (Kubernetes), or set kernel.yama.ptrace_scope to 0 (sysctl -w kernel.yama.ptrace_scope=0); "
    "docs/integrations.md"
)
_STARTED = "Sampling process"
_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>.*):(?P<line>\d+)\)$")
_THREAD = re.compile(r"^thread \((?P<id>0x[0-9a-fA-F]+|\d+)\)(?::\s*(?P<name>.*))?$")


def find_py_spy() -> str | None:
    """The py-spy executable: $STEPSCOPE_PY_SPY, the one installed beside this Python (a virtualenv's bin/), or
    the first on PATH; None when there is none."""
    chosen = os.environ.get(PY_SPY_ENV)
    if chosen:
        return chosen if os.path.isfile(chosen) and os.access(chosen, os.X_OK) else None
    beside = Path(sys.executable).parent / ("py-spy.exe" if os.name == "nt" else "py-spy")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


@dataclass
class _Sampling:
    """One py-spy child over one window, and the thread that watches it."""

    first_step: int
    last_step: int
    raw: Path
    training_thread: int
    process: subprocess.Popen[bytes] | None = None
    started_at: float | None = None  # monotonic time of py-spy's first sample
    stopped_at: float | None = None
    output: list[str] = field(default_factory=list)
    thread: threading.Thread | None = None
    stop_requested: threading.Event = field(default_factory=threading.Event)
    killed: bool = False  # it did not stop on SIGINT in time (its samples are lost)


class PythonSamplingCollector(Collector):
    """py-spy over each active window of this rank (python_sampling=True)."""

    name = "python_sampling"

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.exe: str | None = None
        self.off = False
        self.windows_written = 0
        self._current: _Sampling | None = None
        self._threads: list[threading.Thread] = []
        self._runs: list[_Sampling] = []
        self._kill_said = False
        self._lock = threading.Lock()

    def start(self) -> None:
        self.exe = find_py_spy()
        if self.exe is None:
            self._switch_off(
                "python_sampling=True: py-spy is not installed, so no Python samples are taken "
                f"(pip install 'stepscope[pyspy]', or name the executable in ${PY_SPY_ENV}); training goes on"
            )
            return

    def next_busy(self, step: int) -> int:
        """The first traced step of each window (py-spy is launched then, so that it has attached by the active
        steps) and the window's last active step (it is stopped after it)."""
        if self.off:
            return NEVER
        if self._current is not None:
            return max(step, self._current.last_step)
        return self.ctx.schedule.next_traced_step(step)

    def before_step(self, step: int) -> None:
        if self._current is None and not self.off and self.ctx.schedule.is_traced(step):
            self._launch(step)

    def after_step(self, step: int, wall_ms: float) -> None:
        if self._current is not None and step >= self._current.last_step:
            self._stop()
        return None

    def close(self) -> None:
        if self._current is not None:
            self._current.last_step = max(self._current.first_step, self.ctx.step - 1)
            self._stop()
        deadline = time.monotonic() + STOP_TIMEOUT_S + 2.0  # (all windows together, not each its own wait)
        for thread in self._threads:
            thread.join(max(deadline - time.monotonic(), 0.0))
        for run in self._runs:  # py-spy never outlives the job
            self._kill_if_running(run)
        self._threads, self._runs = [], []

    # --- one window -------------------------------------------------------------------------------
    def _launch(self, first_step: int) -> None:
        last = self.ctx.schedule.window_end(first_step)
        target = self.ctx.writer.path(ArtifactKind.PYTHON_SAMPLES, last)
        run = _Sampling(
            first_step=first_step,
            last_step=last,
            raw=target.with_name("." + target.name.removesuffix(".json") + ".raw.txt"),
            training_thread=threading.get_native_id(),
        )
        run.thread = threading.Thread(target=self._watch, args=(run,), name="stepscope-py-spy", daemon=True)
        self._current = run
        self._threads.append(run.thread)
        self._runs.append(run)
        run.thread.start()

    def _stop(self) -> None:
        run, self._current = self._current, None
        if run is None:
            return
        run.stopped_at = time.monotonic()
        run.stop_requested.set()
        with self._lock:
            process = run.process
        if process is not None and process.poll() is None:
            with contextlib.suppress(OSError):
                process.send_signal(signal.SIGINT)
        # A py-spy that does not end on SIGINT (stuck on a ptrace, or ignoring it) is killed after a bounded wait:
        # the watching thread, the end of the job and close() never wait on it longer
        timer = threading.Timer(STOP_TIMEOUT_S, self._kill_if_running, args=(run,))
        timer.daemon = True
        timer.start()

    def _kill_if_running(self, run: _Sampling) -> None:
        with self._lock:
            process = run.process
            run.stop_requested.set()  # (a py-spy not yet launched never is)
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(OSError):
            process.kill()
        run.killed = True
        if not self._kill_said:
            self._kill_said = True
            warn_user(
                f"stepscope: python_sampling: py-spy did not stop within {STOP_TIMEOUT_S:g} s of SIGINT at the end "
                f"of the window ending at step {run.last_step}; it was killed and that window's samples are lost "
                "(said once; training goes on)",
                StepscopeWarning,
            )

    def _watch(self, run: _Sampling) -> None:
        """The window's thread: launch py-spy, read its output, then parse and write its samples."""
        try:
            self._sample(run)
        except Exception as exc:  # never the job: one warning, and no more sampling
            self._switch_off(
                f"the python_sampling collector failed ({type(exc).__name__}: {exc}); it is switched off for the "
                "rest of the run, training goes on"
            )
        finally:
            with contextlib.suppress(OSError):
                run.raw.unlink()

    def _sample(self, run: _Sampling) -> None:
        assert self.exe is not None
        command = [
            self.exe,
            "record",
            "--pid",
            str(os.getpid()),
            "--format",
            "raw",
            "--nonblocking",
            "--rate",
            str(SAMPLE_RATE_HZ),
            "--function",
            "--full-filenames",
            "--threads",
            "-o",
            str(run.raw),
        ]
        with self._lock:
            if run.stop_requested.is_set():
                return
            run.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a terminal's Ctrl-C reaches the job, and the job stops py-spy
            )
        process = run.process
        _allow_ptrace_by(process.pid)
        assert process.stdout is not None
        for raw_line in process.stdout:
            line = raw_line.decode("utf-8", "replace").strip()
            if not line:
                continue
            if _STARTED in line and run.started_at is None:
                run.started_at = time.monotonic()
            run.output.append(line)
            del run.output[:-20]
        code = process.wait()
        if run.killed:  # (said once by _kill_if_running; what py-spy wrote is not a whole record)
            return
        if run.started_at is None:
            if run.stop_requested.is_set() and code in (0, -signal.SIGINT, 130):
                self._write(run, note="py-spy was stopped before it took its first sample (a short window)")
                return
            said = " ".join(run.output[-3:]) or f"exit status {code}"
            self._switch_off(
                f"python_sampling=True: py-spy could not sample this process ({said}); {PTRACE_FIX}. No Python "
                "samples are taken, training goes on"
            )
            return
        self._write(run)

    def _write(self, run: _Sampling, note: str | None = None) -> None:
        text = run.raw.read_text("utf-8", "replace") if run.raw.is_file() else ""
        end = run.stopped_at if run.stopped_at is not None else time.monotonic()
        sampled = max(end - run.started_at, 0.0) if run.started_at is not None else 0.0
        payload = parse_folded(text, training_thread=run.training_thread)
        payload.rank = self.ctx.rank
        payload.first_step = run.first_step
        payload.last_step = run.last_step
        payload.sampled_s = round(sampled, 4)
        payload.pid = os.getpid()
        payload.errors = _errors(run.output)
        if note is not None:
            payload.notes.append(note)
        self.ctx.writer.write_json(ArtifactKind.PYTHON_SAMPLES, payload, run.last_step)
        self.windows_written += 1

    def _switch_off(self, message: str) -> None:
        if self.off:
            return
        self.off = True
        warn_user(f"stepscope: {message}", StepscopeWarning)


def parse_folded(text: str, *, training_thread: int | None) -> PythonSamples:
    """py-spy's raw output (`--threads --function --full-filenames`: one folded stack per line, its count last)
    as a PythonSamples payload; the run's own fields (rank, steps, time) are left for the caller."""
    frames: list[PyFrame] = []
    frame_index: dict[str, int] = {}
    threads: list[str] = []
    thread_index: dict[str, int] = {}
    counts: dict[tuple[int, tuple[int, ...]], int] = {}
    training: int | None = None
    for line in text.splitlines():
        stack, _, count_text = line.rstrip().rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        parts = stack.split(";")
        thread_label = "unknown thread"
        match = _THREAD.match(parts[0])
        if match is not None:
            parts = parts[1:]
            ident = match.group("id")
            native = int(ident, 16) if ident.startswith("0x") else int(ident)
            thread_label = f"{native} {match.group('name') or ''}".strip()
            if native == training_thread and thread_label not in thread_index:
                training = len(threads)
        t = thread_index.get(thread_label)
        if t is None:
            t = thread_index[thread_label] = len(threads)
            threads.append(thread_label)
        path: list[int] = []
        for part in parts:
            i = frame_index.get(part)
            if i is None:
                found = _FRAME.match(part)
                frame = (
                    PyFrame(found.group("function"), found.group("file"), int(found.group("line")))
                    if found is not None
                    else PyFrame(part, "", 0)
                )
                i = frame_index[part] = len(frames)
                frames.append(frame)
            path.append(i)
        key = (t, tuple(path))
        counts[key] = counts.get(key, 0) + int(count_text)
    stacks = [PyStack(t, list(path), n) for (t, path), n in counts.items()]
    return PythonSamples(
        rank=0,
        first_step=0,
        last_step=0,
        rate_hz=SAMPLE_RATE_HZ,
        sampled_s=0.0,
        pid=0,
        threads=threads,
        training_thread=training,
        frames=frames,
        stacks=stacks,
    )


def _errors(output: list[str]) -> int:
    for line in reversed(output):
        found = re.search(r"Errors: (\d+)", line)
        if found:
            return int(found.group(1))
    return 0


def _allow_ptrace_by(pid: int) -> None:
    """Let `pid` ptrace this process where Yama's ptrace_scope 1 would let only this process's ancestors
    (prctl PR_SET_PTRACER; Linux only, harmless elsewhere or where Yama is absent)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(0x59616D61, ctypes.c_ulong(pid), 0, 0, 0)  # PR_SET_PTRACER
