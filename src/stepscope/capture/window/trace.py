"""The trace collector: torch.profiler over the schedule, one export pass per active window.

At the end of each window the training thread pays for torch's `export_chrome_trace` and a look at the two ends
of the file (a failed write is skipped, not indexed); a worker (window_end.py) then gzips the trace into place
(named by rank and step), writes a per-rank summary text file (top ops + memory overview) and, on the first
profiled rank, prints a top-ops table on the console. The monitor hands the window (its stopped profiler, and
its top ops to come) to the collectors that work per window. With `trace_budget_mb`, the first profiled rank
also checks each window's size as it begins (budget.py), against the last window the worker finished.
"""

from __future__ import annotations

import atexit
import contextlib
import resource
import threading
import time
import warnings
import weakref
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from stepscope.capture.collector import Collector, RunContext, Window
from stepscope.capture.console import StepscopeWarning, console_write, warn_user
from stepscope.capture.schedule import Phase
from stepscope.capture.window.budget import TraceBudget
from stepscope.capture.window.thread_exit import stop_at_thread_exit
from stepscope.capture.window.torch_profiler import (
    another_profiler_records,
    disable_profiler_quietly,
    export_plain_trace,
    trace_only_options,
)
from stepscope.capture.window.window_end import (
    CLOSE_WAIT_S,
    Job,
    TopOps,
    WindowEndWorker,
    WindowWork,
)
from stepscope.report.terminal import fmt_bytes
from stepscope.runfolder import ArtifactKind
from stepscope.runfolder.atomic import temp_path_beside

SUMMARY_ROWS = 40
TOP_OPS = 10  # top ops handed to the collectors of a window (the W&B sink logs 10)
__all__ = ["TraceCollector", "export_plain_trace", "memory_overview"]
COMM_SETTLE_S = 0.005  # see TraceCollector._finish_window


class TraceCollector(Collector):
    """Drives torch.profiler through the schedule: a profiler exists only from the first warmup step of a cycle
    to the export of its window, so a waiting step never touches torch."""

    name = "trace"

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.prof: Any = None
        self._recording = False  # the profiler records (active steps), not just prepared (warmup)
        self._step_range: Any = None  # the ProfilerStep#N record_function of the running step
        self._first_active: int | None = None
        self._skipped: list[int] = []  # last steps of the windows not written
        self._summary_said = False  # a window's summary had no folder (said once)
        self.windows_ended = 0  # whole windows (not partial) whose export began
        # a window whose export a Ctrl-C cut short: (profiler, first step, last step, partial)
        self._interrupted: tuple[Any, int, int, bool] | None = None
        self.worker = WindowEndWorker(ctx.writer, ctx.steps_done)  # its thread starts with the first window
        self._distributed = False
        self._activities: list[Any] = []
        self.window: Window | None = None  # exported by the last after_step / close, until taken
        # trace_budget_mb: checked on the first profiled rank only (one warning per job, not one per rank)
        self.budget = (
            TraceBudget(ctx.config)
            if ctx.config.trace_budget_mb is not None and ctx.is_first_profiled_rank
            else None
        )
        # a profiler recording one warmup step alone, to measure a step for the budget
        self._probe: Any = None
        self._owner_is_main = True  # the thread that started the profiler (see _guard_thread)
        self._dropped = False  # a window stopped on its thread's end, unexported

    def start(self) -> None:
        import torch
        from torch.profiler import ProfilerActivity

        self._activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            self._activities.append(ProfilerActivity.CUDA)
        self._distributed = bool(torch.distributed.is_available() and torch.distributed.is_initialized())
        # torch warns at every window that events are cleared between cycles: that is what we want.
        warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle")
        if self.budget is not None and self.ctx.config.warmup == 0:
            warn_user(
                "stepscope: trace_budget_mb measures a step at a warmup step; with warmup=0 the first window is "
                "exported unchecked and later windows are checked against its size",
                StepscopeWarning,
            )

    def next_busy(self, step: int) -> int:
        schedule = self.ctx.schedule
        if self.prof is not None or self._probe is not None or schedule.is_traced(step):
            return step
        return schedule.next_traced_step(step)

    def before_step(self, step: int) -> None:
        phase = self.ctx.schedule.phase(step)
        if phase is Phase.NONE:
            return
        if self.prof is None:
            if another_profiler_records():
                raise RuntimeError(
                    "another torch.profiler is recording in this process (torch runs one at a time); this "
                    "run's traces are off"
                )
            self._take_outcomes()  # the windows the worker finished meanwhile (their sizes for the budget)
            if self.budget is not None:
                if phase is Phase.WARMUP and self.budget.wants_measurement:
                    self._start_probe()
                else:
                    self._check_budget(step)  # a window begins: nothing records yet
            if self._probe is None:
                self._open()
        if self.prof is not None and phase is not Phase.WARMUP and not self._recording:
            self.prof.start_trace()
            self._recording = True
            self._first_active = step
        from torch.profiler import record_function

        self._step_range = record_function(f"ProfilerStep#{step}")
        self._step_range.__enter__()

    def after_step(self, step: int, wall_ms: float) -> None:
        self._end_step_range()
        if self._probe is not None:
            self._finish_probe()
            self._check_budget(step)
            return
        if self.ctx.schedule.phase(step) is Phase.RECORD_AND_SAVE:
            self._finish_window(step, partial=False)

    def step_failed(self, step: int, exc: BaseException) -> None:
        with contextlib.suppress(Exception):
            self._end_step_range()
        self._drop_probe()

    def close(self) -> None:
        """Stopping inside an active window exports what was recorded so far (a partial window); a window whose
        export a Ctrl-C cut short is exported again (its steps all ran, and torch still holds its events)."""
        try:
            self._end_step_range()
            self._drop_probe()
            if self.prof is not None:
                self._finish_window(max(self.ctx.step - 1, 0), partial=True)
            if self._interrupted is not None:
                prof, first, step, partial = self._interrupted
                self._interrupted = None
                console_write(
                    f"stepscope: exporting the window ending at step {step} again (a Ctrl-C cut its export "
                    "short; another one drops it)\n"
                )
                self.windows_ended -= not partial
                self._export(prof, first, step, partial)
        finally:
            self._wait_for_windows()

    def close_elsewhere(self) -> None:
        """close() on a thread other than the one whose profiler records: a window still open is dropped, and
        stopped on its own thread (from another thread, torch crashes the process): as that thread ends, or at
        the process's exit when it is the main thread (thread_exit.py). The windows already exported are
        finished by the worker as at any close."""
        try:
            if (self.prof is not None or self._probe is not None) and self._owner_is_main:
                atexit.register(self._stop_on_this_thread)
        finally:
            self._wait_for_windows()

    @property
    def dropped_window(self) -> bool:
        """A window was (or will be) dropped: open when its thread ended, or when the monitor closed elsewhere."""
        return self._dropped or self.prof is not None

    def _guard_thread(self) -> None:
        """Stop this thread's profiler on this thread if it ends with a window open (see close_elsewhere)."""
        self._owner_is_main = threading.current_thread() is threading.main_thread()
        collector = weakref.ref(self)

        def stop() -> None:
            live = collector()
            if live is not None:
                live._stop_on_this_thread()

        stop_at_thread_exit(self, stop)

    def _stop_on_this_thread(self) -> None:
        """On the thread that started them: stop the window's profiler and the budget's probe, without export."""
        for attr in ("_probe", "prof"):
            prof = getattr(self, attr)
            setattr(self, attr, None)
            if prof is None:
                continue
            self._dropped = True
            try:
                prof.stop_trace()
            except Exception:
                disable_profiler_quietly()
        self._recording = False
        self._step_range = None

    def abandon(self) -> None:
        """After a failure: drop the profiler untouched. torch raised inside its own state change (e.g. another
        profiler is enabled on this thread), and stop() on such a profiler has crashed the interpreter."""
        self.prof = None
        self._probe = None
        self._recording = False
        step_range, self._step_range = self._step_range, None
        if step_range is not None:
            with contextlib.suppress(Exception):
                step_range.__exit__(None, None, None)

    # --- the profiler -----------------------------------------------------------------------------
    def _open(self) -> None:
        prof = self._new_profiler()
        prof.prepare_trace()
        self.prof = prof
        self._guard_thread()
        self._recording = False
        self._first_active = None

    def _new_profiler(self) -> Any:
        from torch.profiler import profile

        cfg = self.ctx.config
        return profile(
            activities=self._activities,
            record_shapes=cfg.record_shapes,
            profile_memory=cfg.profile_memory,
            with_stack=cfg.with_stack,
            with_flops=cfg.with_flops,
            with_modules=cfg.with_modules,
            **trace_only_options(cfg.with_stack),
        )

    # --- trace_budget_mb ----------------------------------------------------------------------------
    def _start_probe(self) -> None:
        """Record this warmup step alone (the window's profiler is prepared at the next traced step)."""
        try:
            probe = self._new_profiler()
            probe.prepare_trace()
            probe.start_trace()
            self._guard_thread()
        except Exception as exc:  # dropped untouched (see abandon); the window's profiler opens as usual
            self._budget_failed("starting the profiler that measures a step", exc)
            return
        self._probe = probe

    def _finish_probe(self) -> None:
        probe, self._probe = self._probe, None
        if self._distributed:
            time.sleep(COMM_SETTLE_S)  # as in _finish_window
        try:
            probe.stop_trace()
        except Exception as exc:
            disable_profiler_quietly()
            self._budget_failed("stopping the profiler that measured a step", exc)
            return
        except BaseException:
            disable_profiler_quietly()
            raise
        assert self.budget is not None
        plain: Path | None = None
        try:
            plain = temp_path_beside(self.ctx.writer.path(ArtifactKind.TRACE, self.ctx.step).with_suffix(""))
            probe.export_chrome_trace(str(plain))
            self.budget.measured(plain.read_bytes())
        except Exception as exc:
            self._budget_failed("measuring a step", exc)
        finally:
            if plain is not None:
                with contextlib.suppress(OSError):
                    plain.unlink()

    def _drop_probe(self) -> None:
        """The job stopped (or the step failed) while a step was measured: stop without measuring."""
        probe, self._probe = self._probe, None
        if probe is not None:
            try:
                probe.stop_trace()
            except Exception:
                disable_profiler_quietly()

    def _check_budget(self, step: int) -> None:
        """Before the window of traced `step` records: warn (once per run) if it will exceed the budget. Here,
        rather than inside the window, the warning's own work (Python frames with with_stack) is not traced."""
        assert self.budget is not None
        schedule = self.ctx.schedule
        try:
            message = self.budget.check(schedule.active, schedule.window_end(step))
        except Exception as exc:
            self._budget_failed("estimating the window's size", exc)
            return
        if message:
            warn_user(message, StepscopeWarning)

    def _budget_failed(self, what: str, exc: Exception) -> None:
        assert self.budget is not None
        self.budget.done = True
        warn_user(
            f"stepscope: the trace budget check failed while {what} ({type(exc).__name__}: {exc}); it is off "
            "for this run, traces go on",
            StepscopeWarning,
        )

    def _end_step_range(self) -> None:
        step_range, self._step_range = self._step_range, None
        # A KeyboardInterrupt can land inside record_function.__enter__ after torch's op ran but before the
        # handle was kept (`record` still None): exiting it would raise, fail the collector in close, and leave
        # the profiler running into interpreter exit (a SIGSEGV, about 1 Ctrl-C in 50). Nothing to exit then.
        if step_range is not None and getattr(step_range, "record", True) is not None:
            step_range.__exit__(None, None, None)

    def _finish_window(self, step: int, partial: bool) -> None:
        prof, recording, first = self.prof, self._recording, self._first_active
        self.prof, self._recording, self._first_active = None, False, None
        if not recording:
            # Only prepared (the job stopped in warmup): start and stop without export, as torch does.
            with contextlib.suppress(Exception):
                prof.start_trace()
            prof.stop_trace()
            return
        if self._distributed:
            # A collective's range ends on the backend's thread *after* the step saw it complete (gloo runs
            # the future's callbacks after waking the waiter); stopping the profiler while that thread still
            # records has corrupted the heap (tests/jobs/test_two_ranks_one_run_folder.py, 1 run in ~40). Let it finish first.
            time.sleep(COMM_SETTLE_S)
        try:
            prof.stop_trace()
        except BaseException:
            # A Ctrl-C or an error inside torch's stop: the state is unknown, nothing is exported, but a
            # profiler left enabled crashes the interpreter at exit. Disable it, then let the error go on.
            disable_profiler_quietly()
            raise
        self._export(prof, first if first is not None else step, step, partial)

    def _export(self, prof: Any, first: int, step: int, partial: bool) -> None:
        """The training thread's part of a window's end: torch's export and a look at what it wrote; the rest
        (gzip, summary file, console table, manifest entries) is the worker's (window_end.py)."""
        ctx = self.ctx
        try:
            trace_path = ctx.writer.path(ArtifactKind.TRACE, step)
        except OSError as exc:  # (its folder cannot be made, or leads out of the run folder)
            self._skip_window(step, f"{type(exc).__name__}: {exc}")
            return
        plain = temp_path_beside(trace_path.with_name(trace_path.name.removesuffix(".gz")))
        self.windows_ended += not partial  # (its steps all ran: whatever becomes of its export)
        try:
            problem = export_plain_trace(prof, plain)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                plain.unlink()
            if isinstance(exc, KeyboardInterrupt):  # the window is whole: close() exports it again
                self._interrupted = (prof, first, step, partial)
            raise
        if problem is not None:
            with contextlib.suppress(OSError):
                plain.unlink()
            self._skip_window(step, problem)
            return
        top_ops: Future[TopOps | None] = Future()
        summary = self._summary_path(step)
        job = Job(
            plain=str(plain),
            trace=str(trace_path),
            summary=None if summary is None else str(summary),
            header=f"stepscope summary: rank {ctx.rank}, window ending at step {step} (steps {first}-{step})",
            memory=memory_overview(),
            top=max(ctx.config.top_n, TOP_OPS),
            summary_rows=SUMMARY_ROWS,
        )
        title = None
        if ctx.is_first_profiled_rank and ctx.config.console:
            title = f"stepscope: top ops, rank {ctx.rank}, window ending at step {step}"
        self.worker.submit(WindowWork(job, ctx.rank, first, step, title, ctx.config.top_n, top_ops))
        self.window = Window(
            rank=ctx.rank,
            first_step=first,
            last_step=step,
            trace_path=trace_path,
            profiler=prof,
            top_ops=top_ops,
            partial=partial,
        )

    def _summary_path(self, step: int) -> Path | None:
        """Where the window's summary goes; None when its folder cannot be made (a file in its place, no
        permission): that window's summary is lost, said once per run, and its trace is written as ever."""
        try:
            return self.ctx.writer.path(ArtifactKind.SUMMARY, step)
        except OSError as exc:
            if not self._summary_said:
                self._summary_said = True
                warn_user(
                    f"stepscope: the summary of the window ending at step {step} (rank {self.ctx.rank}) has no "
                    f"folder to go to ({type(exc).__name__}: {exc}); windows whose summary cannot be written get "
                    "their trace only, training goes on",
                    StepscopeWarning,
                )
            return None

    def take_window(self) -> Window | None:
        """The window exported by the last after_step / close, once."""
        window, self.window = self.window, None
        return window

    def _skip_window(self, step: int, problem: str) -> None:
        self._skipped.append(step)
        if len(self._skipped) == 1:
            warn_user(
                f"stepscope: the trace of the window ending at step {step} (rank {self.ctx.rank}) was not "
                f"written ({problem}); the window is skipped (later windows that fail are skipped without a "
                "warning), training goes on",
                StepscopeWarning,
            )

    def _take_outcomes(self) -> None:
        """What the worker learned about finished windows, on the training thread: the trace budget learns
        their sizes; their warnings are said here (a warning from the worker's thread would name no line of
        the job, and tests and users catch warnings on the training thread)."""
        outcomes = self.worker.outcomes
        while not outcomes.empty():
            outcome = outcomes.get()
            if outcome.json_bytes is None:
                self._skip_window(outcome.last_step, outcome.warning or "unknown")
                continue
            if outcome.warning is not None:
                warn_user(outcome.warning, StepscopeWarning)
            if self.budget is not None and not self.budget.done and outcome.gz_bytes is not None:
                try:
                    self.budget.exported(outcome.json_bytes, outcome.gz_bytes, outcome.steps)
                except Exception as exc:
                    self._budget_failed("measuring the exported window", exc)

    def _wait_for_windows(self) -> None:
        if not self.worker.close():
            warn_user(
                f"stepscope: the windows exported last were still being written after {CLOSE_WAIT_S:.0f} s; "
                "their traces may be missing from the run folder",
                StepscopeWarning,
            )
        self._take_outcomes()
        if self._skipped:
            steps = ", ".join(str(step) for step in self._skipped)
            with contextlib.suppress(Exception):  # the warning said it; the manifest's notes keep it
                self.ctx.writer.update(
                    notes=[
                        f"rank {self.ctx.rank}: the trace of the window(s) ending at step {steps} was not written"
                    ]
                )


def memory_overview() -> str:
    """A short memory section for the summary file: process RSS and, with CUDA, the allocator's peaks."""
    import psutil
    import torch

    lines = ["Memory overview", "---------------"]
    rss = psutil.Process().memory_info().rss
    peak_rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    lines.append(f"process RSS: {fmt_bytes(rss)} now, {fmt_bytes(max(rss, peak_rss_kib * 1024))} peak")
    vm = psutil.virtual_memory()
    lines.append(f"system memory: {fmt_bytes(vm.used)} used of {fmt_bytes(vm.total)} ({vm.percent:.0f}%)")
    if torch.cuda.is_available():
        for dev in range(torch.cuda.device_count()):
            lines.append(
                f"cuda:{dev}: allocated {fmt_bytes(torch.cuda.memory_allocated(dev))}, "
                f"reserved {fmt_bytes(torch.cuda.memory_reserved(dev))}, "
                f"peak allocated {fmt_bytes(torch.cuda.max_memory_allocated(dev))}, "
                f"peak reserved {fmt_bytes(torch.cuda.max_memory_reserved(dev))}"
            )
    else:
        lines.append("CUDA: not available (CPU run)")
    return "\n".join(lines)
