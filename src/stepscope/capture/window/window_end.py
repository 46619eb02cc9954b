"""A window's end, off the training thread: the training thread pays for torch's `export_chrome_trace` and a
look at the two ends of the file it wrote; a worker thread does the rest.

The worker hands each window to a child process (`python -m stepscope.cli.window_end`, kept from one window to
the next: child.py, which also says how it yields to training), which reads the trace
with stepscope's own loader (much faster than torch's `key_averages`, and the proof that the file is a whole
trace), gzips it into place and writes the per-rank summary file. While the child runs, the worker thread only
waits on it (no GIL held); then it indexes what was written in the manifest, prints the top-ops table (labelled
with its window) and hands the window's top ops to the collectors that asked for them. What the training thread
must hear (a warning, the sizes the trace budget learns from) waits in `outcomes` until the trace collector's
next hook. A child that cannot run, crashes or overruns its time still leaves the window's trace: the worker
gzips it itself, without a summary. Windows are handled one at a time, in order.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import queue
import re
import shutil
import subprocess
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from stepscope.capture.console import capture_console
from stepscope.capture.window.child import Child, StepTrail
from stepscope.compress import open_gzip
from stepscope.runfolder import ArtifactKind
from stepscope.runfolder.atomic import FILE_MODE, temp_path_beside

CLOSE_WAIT_S = 900.0  # what close waits for the windows still in hand
# Windows waiting behind the one in hand past which the worker only gzips (no child, no summary, no table) until
# it has caught up: windows that end every step or two would otherwise queue without end, and close (at exit,
# after a Ctrl-C) would wait for a child per window.
BACKLOG_WINDOWS = 2
_TAIL_BYTES = 4096
# The end of a whole chrome trace: the traceEvents list closes, string-valued keys may follow (kineto writes
# "traceName"), then the object closes.
_WHOLE_TAIL = re.compile(rb'\]\s*(?:,\s*"[^"\\]*"\s*:\s*"(?:[^"\\]|\\.)*"\s*)*\}\s*\Z')


class Job(msgspec.Struct):
    """One window's work, as the worker sends it to the child on stdin."""

    plain: str  # the exported JSON, a hidden temp file beside `trace` (the worker removes it)
    trace: str  # the .json.gz to write
    summary: str | None  # the summary file to write (None: none)
    header: str  # the summary file's first line
    memory: str  # its memory section, taken on the training thread as the window ended
    top: int  # rows of the console table and of the top ops handed on
    summary_rows: int = 40


class Result(msgspec.Struct):
    """What the child wrote, and the rows the worker prints (ops by self CPU time, kernels by total time)."""

    json_bytes: int
    gz_bytes: int
    summary_error: str | None
    ops: list[dict[str, Any]]
    kernels: list[dict[str, Any]]


@dataclass(frozen=True)
class TopOps:
    """A window's top host ops (by self CPU time) and GPU kernels (by total time), as the summary has them:
    dicts with name, count, self_us, total_us, ... (ops) and name, count, total_us, ... (kernels)."""

    ops: list[dict[str, Any]]
    kernels: list[dict[str, Any]]


@dataclass(frozen=True)
class Outcome:
    """What the training thread learns about a handled window: its sizes (None: it was skipped), a warning."""

    last_step: int
    steps: int
    json_bytes: int | None = None
    gz_bytes: int | None = None
    warning: str | None = None
    summary_failed: bool = False


@dataclass
class WindowWork:
    job: Job
    rank: int
    first_step: int
    last_step: int
    title: str | None  # the console table's title; None: no table
    console_rows: int
    top_ops: Future[TopOps | None]


def export_problem(path: Path) -> str | None:
    """Why the file torch exported is not a whole chrome trace (None: it looks whole), from its size and its two
    ends only: torch logs a failed write (a full disk, a file-size limit) and raises nothing."""
    size = path.stat().st_size
    if size == 0:
        return "torch wrote an empty file: a full disk or a file-size limit?"
    with open(path, "rb") as fh:
        head = fh.read(64).lstrip()
        fh.seek(max(size - _TAIL_BYTES, 0))
        tail = fh.read()
    if not head.startswith(b"{") or _WHOLE_TAIL.search(tail) is None:
        return f"torch wrote {size} bytes that end before the trace does (a full disk or a file-size limit?)"
    return None


def write_gzip(plain: Path, target: Path) -> int:
    """Gzip `plain` into `target` through a hidden temp file beside it (removed on every way out but a kill);
    returns the size written."""
    packed = temp_path_beside(target.with_name(target.name + ".part"))
    try:
        with open(plain, "rb") as src, open_gzip(packed) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        os.chmod(packed, FILE_MODE)
        os.replace(packed, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            packed.unlink()
    return target.stat().st_size


class WindowEndWorker:
    """One thread that finishes the windows a rank exports, in order (see the module's docstring)."""

    def __init__(self, writer: Any, steps_done: Callable[[], int]) -> None:
        self.writer = writer
        self.steps_done = steps_done  # the job's steps completed (a StepTrail's clock)
        self.outcomes: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        self._work: queue.SimpleQueue[WindowWork | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._summaries_off = False  # a child failed: the rest of the run's windows are only gzipped
        self._backlog_said = False
        self._child = Child()  # (started at the first window, kept for the later ones)
        self._submitted = 0
        self._finished = 0  # (counted on the worker's thread)

    @property
    def busy(self) -> bool:
        """Windows are in hand: their end work (gzip, summary, index) still runs."""
        return self._finished < self._submitted

    def submit(self, work: WindowWork) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="stepscope-window-end", daemon=True)
            self._thread.start()
            # A trace collector switched off is never closed: its windows in hand still finish at exit.
            atexit.register(self.close)
        self._submitted += 1
        self._work.put(work)

    def close(self, timeout: float = CLOSE_WAIT_S) -> bool:
        """Finish the windows in hand (bounded); False when some were still running at the deadline."""
        thread, self._thread = self._thread, None
        if thread is None:
            return True
        atexit.unregister(self.close)
        self._work.put(None)
        thread.join(timeout)
        return not thread.is_alive()

    def _run(self) -> None:
        try:
            self._run_windows()
        finally:
            self._child.close()

    def _run_windows(self) -> None:
        while (work := self._work.get()) is not None:
            top: TopOps | None = None
            try:
                top, outcome = self._finish(work)
            except Exception as exc:  # never let the thread die with windows still to come
                outcome = Outcome(work.last_step, _steps(work), warning=_skipped(work, exc))
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(work.job.plain)
                work.top_ops.set_result(top)
            self.outcomes.put(outcome)
            self._finished += 1

    def _finish(self, work: WindowWork) -> tuple[TopOps | None, Outcome]:
        job, steps = work.job, _steps(work)
        if self._summaries_off:
            return None, self._gzip_only(work, None)
        if self._work.qsize() > BACKLOG_WINDOWS:
            return None, self._behind(work)
        trail = StepTrail(self.steps_done)
        try:
            status, answer, reason = self._child.run(msgspec.json.encode(job), trail)
            result = msgspec.convert(answer, type=Result) if status == 0 else None
        except (OSError, subprocess.SubprocessError, msgspec.ValidationError) as exc:
            return None, self._gzip_only(work, f"{type(exc).__name__}: {exc}")
        if status == 2:  # the loader refused the file: it is not a trace, index nothing
            return None, Outcome(work.last_step, steps, warning=_skipped(work, reason))
        if result is None:
            return None, self._gzip_only(work, f"exit status {status}: {reason}")
        writer = self.writer
        trail.now()
        writer.add(ArtifactKind.TRACE, Path(job.trace), work.last_step, beside_steps=trail.ranges)
        if job.summary is not None and result.summary_error is None:
            writer.add(ArtifactKind.SUMMARY, Path(job.summary), work.last_step)
        top = TopOps(result.ops, result.kernels)
        if work.title is not None:
            print_top_ops(TopOps(top.ops[: work.console_rows], top.kernels[: work.console_rows]), work.title)
        warning = None
        if result.summary_error is not None:
            warning = (
                f"stepscope: the summary of the window ending at step {work.last_step} was not written "
                f"({result.summary_error}); its trace is written"
            )
        return top, Outcome(work.last_step, steps, result.json_bytes, result.gz_bytes, warning)

    def _behind(self, work: WindowWork) -> Outcome:
        """More windows wait than the worker can summarise: this one's trace only (said once per run)."""
        outcome = self._gzip_only(work, None)
        if outcome.gz_bytes is not None and not self._backlog_said:
            self._backlog_said = True
            outcome = dataclasses.replace(
                outcome,
                warning=(
                    f"stepscope: windows end faster than their summaries are written (more than {BACKLOG_WINDOWS} "
                    f"waiting at the window ending at step {work.last_step}); until the worker catches up, windows "
                    "get their trace only, without a summary or a console table (fewer or shorter windows avoid it)"
                ),
            )
        return outcome

    def _gzip_only(self, work: WindowWork, cause: str | None) -> Outcome:
        """The child could not summarise the window: keep its trace (gzipped here, as the child would)."""
        job = work.job
        json_bytes = os.stat(job.plain).st_size
        try:
            gz_bytes = write_gzip(Path(job.plain), Path(job.trace))
        except OSError as exc:
            return Outcome(
                work.last_step, _steps(work), warning=_skipped(work, f"{type(exc).__name__}: {exc}")
            )
        # (gzipped here, on the worker's thread, at the job's priority: the steps it took ran beside it)
        step = self.steps_done()
        self.writer.add(
            ArtifactKind.TRACE, Path(job.trace), work.last_step, beside_steps=[(work.last_step + 1, step)]
        )
        warning = None
        if cause is not None:
            self._summaries_off = True
            warning = (
                f"stepscope: the summary of the window ending at step {work.last_step} failed ({cause}); "
                "summaries and the console table are off for this run, traces go on"
            )
        return Outcome(work.last_step, _steps(work), json_bytes, gz_bytes, warning, summary_failed=True)


def _steps(work: WindowWork) -> int:
    return work.last_step - work.first_step + 1


def _skipped(work: WindowWork, cause: object) -> str:
    """The warning of a window whose trace was not written: its cause alone (the trace collector says the
    sentence around it, once: trace.py's _skip_window)."""
    return str(cause)


def print_top_ops(top: TopOps, title: str) -> None:
    """The console table of a window: its top host ops by self CPU time, then its top kernels if it has any."""
    from stepscope.report.terminal import fmt_pct, fmt_us, make_table  # (rich: only once a window prints)

    console = capture_console()
    rows = [
        [o["name"], o["count"], fmt_us(o["self_us"]), fmt_us(o["total_us"]), fmt_pct(o["self_pct"])]
        for o in top.ops
    ]
    console.print(make_table(title, ["op", "calls", "self\nCPU", "CPU\ntotal", "%\nself"], rows))
    if top.kernels:
        rows = [[k["name"], k["count"], fmt_us(k["total_us"]), fmt_pct(k["pct"])] for k in top.kernels]
        console.print(
            make_table(f"{title}: kernels", ["kernel", "launches", "total", "%\nkernel time"], rows)
        )
