"""The process that does a window's end work beside training (`python -m stepscope.cli.window_end`), as the
window-end worker (window_end.py) keeps it: started at a rank's first window and kept for the rank's later ones (its
start-up, Python and the analysis modules, costs more CPU than a small window's work), at the lowest priority the
system allows, taking its turn with the other ranks' children of this machine, bounded in CPU time and in wait.

The worker writes one job a line (a window_end.Job as JSON) on the child's stdin; the child answers each with one
line on its stdout (a Reply). Closing its stdin ends it. A child that exits after a reply (one that grew large on
a big trace does) is started again for the next window.
"""

from __future__ import annotations

import contextlib
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import msgspec

CHILD_COMMAND = (sys.executable, "-m", "stepscope.cli.window_end")
# The child's numeric libraries run on one thread: it works beside training, on the cores training leaves idle.
CHILD_THREADS = {v: "1" for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
# It reads each window's temp file once: the cache of decoded tables (analysis/read/cache/tables.py) would write a table
# no one reads again, beside training
CHILD_ENV = {**CHILD_THREADS, "STEPSCOPE_NO_CACHE": "1"}
LOWEST_NICE = 19
# One job: past CHILD_TIMEOUT_S of the child's CPU time on it (or, where that cannot be read, of wall time) the
# worker kills the child and gzips the trace itself. A child that training leaves no core to (it runs only on
# idle ones) is waited for up to CHILD_WAIT_S.
CHILD_TIMEOUT_S = 600.0
CHILD_WAIT_S = 3600.0
POLL_S = 0.1  # how often the worker looks at its child (its CPU time, the job's step)
BUSY_CPU_S = 0.02  # the child's CPU time in one poll from which the steps in progress ran beside its work
# a child whose memory stays above this after a job exits (the next window starts a fresh one): a big trace's
# heap is not kept beside training
KEEP_RSS_BYTES = 256 << 20
_CLOSE_S = 5.0  # what closing waits for the child to exit before killing it


class Reply(msgspec.Struct):
    """The child's answer to one job: status 0 done (result), 2 the file is not a whole trace (nothing written),
    1 anything else (error: the reason; the child's temp files are removed, the exported file left)."""

    status: int
    result: Any = None  # a window_end.Result as decoded JSON (the worker types it)
    error: str | None = None


class StepTrail:
    """The job's steps that ran while a window's end work used the CPU: each poll (every POLL_S) where the child
    used BUSY_CPU_S or more marks the steps in progress since the last poll (all of them where its CPU time
    cannot be read); the worker's own work after the child adds the step it ends in. Merged [first, last]
    ranges, as the manifest's trace entry keeps them (`beside_steps`)."""

    def __init__(self, steps_done: Callable[[], int]) -> None:
        self.steps_done = steps_done
        self._ranges: list[list[int]] = []
        self._step = steps_done()
        self._cpu: float | None = None  # the child's CPU time at the last poll (None: none read yet)

    def poll(self, cpu: float | None) -> None:
        """At a poll: `cpu` is the child's CPU time now (None: it cannot be read, so it counts as busy)."""
        step = self.steps_done()
        if cpu is None or (self._cpu is not None and cpu - self._cpu >= BUSY_CPU_S):
            self.mark(self._step, step)
        self._cpu = cpu
        self._step = step

    def mark(self, first: int, last: int) -> None:
        if self._ranges and first <= self._ranges[-1][1] + 1:
            self._ranges[-1][1] = max(self._ranges[-1][1], last)
        else:
            self._ranges.append([first, last])

    def now(self) -> None:
        step = self.steps_done()
        self.mark(step, step)

    @property
    def ranges(self) -> list[tuple[int, int]]:
        return [(a, b) for a, b in self._ranges]


class Child:
    """The worker's child process (see the module's docstring); `run` one job at a time, `close` at the end."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._lines: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        self._stderr: IO[bytes] | None = None
        self._reader: threading.Thread | None = None

    def run(self, job: bytes, trail: StepTrail) -> tuple[int, Any, str]:
        """(status, result, reason) of `job` (see Reply); an exited child's status is its exit status. Raises
        OSError when no child can be started, subprocess.TimeoutExpired past its time (the child is killed)."""
        proc = self._start()
        cpu0 = cpu_seconds(proc.pid)
        trail.poll(cpu0)  # (its baseline: the steps before are not this job's)
        started = time.monotonic()
        try:
            assert proc.stdin is not None
            proc.stdin.write(job + b"\n")
            proc.stdin.flush()
        except OSError:  # it died: its exit status and last words say why
            return self._died(proc)
        while True:
            try:
                line = self._lines.get(timeout=POLL_S)
            except queue.Empty:
                cpu = cpu_seconds(proc.pid)
                trail.poll(cpu)
                waited = time.monotonic() - started
                used = cpu - cpu0 if cpu is not None and cpu0 is not None else waited
                if used >= CHILD_TIMEOUT_S or waited >= CHILD_WAIT_S:
                    self.close(kill=True)
                    raise subprocess.TimeoutExpired(CHILD_COMMAND, waited) from None
                continue
            trail.poll(None)  # (its last moments, since the last poll: it was running)
            if not line:  # end of its stdout: it died
                return self._died(proc)
            try:
                reply = msgspec.json.decode(line, type=Reply)
            except msgspec.DecodeError:
                self.close(kill=True)
                return 1, None, f"an answer that is not one: {line[:80]!r}"
            return reply.status, reply.result, reply.error or ""

    def close(self, kill: bool = False) -> None:
        """End the child: its stdin closed, a bounded wait, then a kill."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            if proc.stdin is not None:
                proc.stdin.close()
        if kill:
            proc.kill()
        try:
            proc.wait(_CLOSE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.join(_CLOSE_S)  # (it ends at the child's end of stdout)
        if proc.stdout is not None and (reader is None or not reader.is_alive()):
            proc.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def _start(self) -> subprocess.Popen[bytes]:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            return proc
        self.close()
        # (read only for the last words of a child that died; closed by close())
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115
        proc = subprocess.Popen(
            list(CHILD_COMMAND),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env={**os.environ, **CHILD_ENV},
        )
        lower_priority(proc.pid)  # (the child lowers itself too, once started: this covers its start-up)
        self._proc, self._lines = proc, queue.SimpleQueue()
        threading.Thread(
            target=_read_lines,
            args=(proc.stdout, self._lines),
            name="stepscope-window-end-child",
            daemon=True,
        ).start()
        return proc

    def _died(self, proc: subprocess.Popen[bytes]) -> tuple[int, Any, str]:
        try:
            code = proc.wait(_CLOSE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        words = "no message"
        if self._stderr is not None:
            with contextlib.suppress(OSError):
                self._stderr.seek(0)
                lines = self._stderr.read().decode("utf-8", "replace").strip().splitlines()
                words = lines[-1] if lines else words
        self.close()
        return code if code else 1, None, words


def _read_lines(stream: IO[bytes] | None, lines: queue.SimpleQueue[bytes]) -> None:
    """The child's stdout, a line at a time, then b'' at its end."""
    if stream is not None:
        with contextlib.suppress(OSError, ValueError):
            for line in stream:
                lines.put(line)
    lines.put(b"")


def cpu_seconds(pid: int) -> float | None:
    """The CPU time process `pid` has used (Linux's /proc), None where it cannot be read."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def rss_bytes() -> int | None:
    """This process's resident memory now (Linux's /proc), None where it cannot be read."""
    try:
        return int(Path("/proc/self/statm").read_bytes().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def lower_priority(pid: int = 0) -> None:
    """Make process `pid` (0: this one) yield to every other: Linux's SCHED_IDLE policy (it runs only on a core
    nothing else wants), and the highest niceness where that is refused or missing."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, pid, LOWEST_NICE)
    with contextlib.suppress(OSError, AttributeError):
        os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))  # type: ignore[attr-defined]


def node_lock_path() -> Path:
    """The file whose lock the window-end children of this machine take in turn (one user's jobs): one at a time
    per node, not one per rank, whatever the number of ranks and runs on it."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir(), f"stepscope-window-end-{uid}.lock")


@contextlib.contextmanager
def node_turn() -> Iterator[None]:
    """Wait for this node's turn (see node_lock_path); where no lock can be had (no fcntl, no writable temp
    folder), go at once."""
    try:
        import fcntl

        fd = os.open(node_lock_path(), os.O_RDWR | os.O_CREAT, 0o600)
    except (ImportError, OSError):
        yield
        return
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # (the lock goes with it)
