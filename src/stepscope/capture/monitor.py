"""`performance_monitor`: the capture spine. A decorator (each call is one step) or a context manager
with `step()`; it owns the collectors of this rank and guarantees that profiling never breaks training.

Nothing here imports torch until the first step of an enabled monitor on a recording rank.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import itertools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from stepscope.capture.collector import NEVER, Collector, Guard, RunContext, overrides
from stepscope.capture.config import ProfileConfig
from stepscope.capture.console import StepscopeWarning, warn_user
from stepscope.capture.engine import follow_engine, is_deepspeed_engine
from stepscope.capture.output.writer import RunWriter
from stepscope.capture.schedule import Schedule
from stepscope.capture.startup import make_collectors, make_watch, open_context
from stepscope.capture.step_loop import StepLoop, _perf_ns, _thread_id
from stepscope.errors import ConfigError
from stepscope.runfolder.payloads import StepMetrics

F = TypeVar("F", bound=Callable[..., Any])

_NULL_CONTEXT = contextlib.nullcontext()
_monitor_index = itertools.count()
# The monitor of this process that is recording: torch runs one profiler at a time ("Profiler is already
# enabled on this thread"), so a second monitor is refused with a warning and records nothing.
_recording: PerformanceMonitor | None = None


class PerformanceMonitor(StepLoop):
    """Profiles a training loop on the ranks that record; see `performance_monitor` for the options."""

    def __init__(
        self, model: Any = None, *, config: ProfileConfig | str | Path | None = None, **options: Any
    ) -> None:
        self.config = ProfileConfig.build(config, **options)
        c = self.config
        self.schedule = Schedule(
            wait=c.wait, warmup=c.warmup, active=c.active, repeat=c.repeat, skip_first=c.skip_first
        )
        if c.on_demand or c.watch:
            from stepscope.capture.window.trigger import install_sigusr2_handler, never_schedule

            if c.on_demand:
                self.schedule = never_schedule(self.schedule)
            # here, where the monitor is made (mostly the main thread): its first step may run on another
            # thread, where no signal handler can be installed, and a SIGUSR2 would then kill the job
            install_sigusr2_handler()
        self.model = model
        self.engine: Any = model if is_deepspeed_engine(model) else None  # DeepSpeed: capture/engine.py
        self.rank = 0
        self.world_size = 1
        self.recording = False
        self.steps_done = 0
        self._state = "new"  # new -> running -> closed
        self._index = next(_monitor_index)
        self._run_dir: Path | None = None
        self._ctx: RunContext | None = None
        self._writer: RunWriter | None = None
        self._trace: Any = None  # the TraceCollector
        self._collectors: list[Collector] = []  # all of them, the trace collector included
        self._before: list[Callable[[int], Any]] = []
        self._after: list[Callable[[int, float], Any]] = []
        self._on_record: list[Callable[[StepMetrics], Any]] = []
        self._on_window: list[Callable[[Any], Any]] = []
        self._failed_hooks: list[Callable[[int, BaseException], Any]] = []
        self._listeners: list[Callable[[StepMetrics], Any]] = []
        self._windows_planned = 0
        self._guard = Guard()
        self._guard.on_disable = self._on_disable
        self._step_start = 0
        self._record_function: Any = None
        self._nvtx: Callable[[str], Any] | None = None  # regions as record_function + NVTX (nsight on CUDA)
        # Steps below this index need no collector: they cost a clock read and an append (the hot path).
        self._quiet_until = 0
        self._quiet: list[tuple[int, int]] = []  # (step, wall ns) of quiet steps, the writer's buffer
        self._begin_again = False  # decorator form: a busy step failed, its next call begins it again
        # torch's profiler belongs to the thread that starts it (stopping it from another one crashes the
        # process): the collectors work only at the steps of the thread that started the monitor.
        self._owner = 0
        self._owner_name = ""
        self._other_threads = False  # a step ended on another thread (warned once)
        self._open: int | None = None  # the step whose before_step hooks ran, until its after_step hooks
        self._start_lock = threading.Lock()
        if self.engine is not None and self.enabled:
            follow_engine(self, self.engine)

    # --- public surface ---------------------------------------------------------------------------
    @property
    def enabled(self) -> bool:
        return self.config.enabled

    @property
    def run_dir(self) -> Path | None:
        """This run's folder (all ranks of a job share it); None when the monitor is disabled."""
        if not self.enabled:
            return None
        if self._run_dir is None:
            self._resolve_identity()
        return self._run_dir

    def __call__(self, fn: F) -> F:
        """Decorate a train-step function: each call is one step; its return value passes through.

        A step ends when its call returns, and the next step begins then: fetching the next call's batch is
        part of the next step, as in the context-manager form (a step runs from one `step()` to the next).
        With a DeepSpeed engine (its optimizer steps are the steps) `fn` is returned as it is."""
        if not self.enabled or self.engine is not None:
            return fn

        @functools.wraps(fn)
        def stepped(*args: Any, **kwargs: Any) -> Any:
            step = self.steps_done
            if step < self._quiet_until:  # no collector works at this step (it began at the last return)
                try:
                    result = fn(*args, **kwargs)
                except BaseException as exc:  # (free until raised) step_failed runs on every step
                    self._step_failed(step, exc)
                    self._step_start = _perf_ns()  # the step runs again at the next call
                    raise
                self._end_quiet_step(step)
                return result
            return self._busy_call(fn, args, kwargs)

        return stepped  # type: ignore[return-value]

    def _busy_call(self, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        if self._state != "running":
            if self._state == "closed":
                return fn(*args, **kwargs)
            self.start()  # step 0 begins with the first call
        if not self.recording:
            self.steps_done += 1
            return fn(*args, **kwargs)
        if _thread_id() != self._owner:
            result = fn(*args, **kwargs)
            self._step_on_other_thread()
            return result
        step = self.steps_done
        if self._begin_again:
            self._begin_again = False
            self._begin_step()
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            self._step_failed(step, exc)
            self._begin_again = True  # the collectors closed the failed step: the next call begins it anew
            raise
        self._end_busy_step()
        self._begin_step()
        return result

    def start(self, first_step: int = 0) -> PerformanceMonitor:
        """Begin profiling; step `first_step` (default 0) starts now. Entering `with monitor:` does this.

        A job resumed at step N passes `first_step=N`: steps keep the job's own numbers (in the traces and the
        metrics) and the schedule counts from N, so the first window still comes `wait` steps after the start.
        """
        if first_step < 0:
            raise ConfigError(f"first_step must be >= 0 (got {first_step})")
        with self._start_lock:  # steps from several threads: one of them starts the monitor
            if self.enabled and self._state == "new":
                self._owner = _thread_id()
                self._owner_name = threading.current_thread().name
                self._start_from(first_step)
        return self

    def _start_from(self, first_step: int) -> None:
        if first_step:
            self.steps_done = first_step
            self.schedule = dataclasses.replace(
                self.schedule, skip_first=self.schedule.skip_first + first_step
            )
        self._start_safely()
        if self.recording:
            self._begin_step()

    def __enter__(self) -> PerformanceMonitor:
        return self.start()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is not None and self.recording and self._state == "running":
            self._step_failed(self.steps_done, exc)
        self.close()

    def step(self) -> None:
        """Mark the end of one step (context-manager form)."""
        step = self.steps_done
        if step < self._quiet_until:  # the step that ends, and so far the next one, need no collector
            self._end_quiet_step(step)
            return
        if not self.enabled or self._state == "closed":
            return
        if self._state == "new":
            # step() before start(): this call marks the beginning of step 0.
            self.start()
            return
        if not self.recording:
            self.steps_done += 1
            return
        if _thread_id() != self._owner:
            self._step_on_other_thread()
            return
        self._end_busy_step()
        self._begin_step()

    def add_step_listener(self, listener: Callable[[StepMetrics], Any]) -> None:
        """Call `listener(line)` with the metrics line of every step a collector worked at (the steps of each
        window among them), on a recording rank. A listener that raises is dropped with one warning."""
        self._listeners.append(listener)
        self._rebuild_hooks()

    def region(self, name: str) -> Any:
        """A named range (record_function) inside a step: forward, backward, optimizer, ...

        Outside warmup/active steps it is a no-op context, so it costs nothing while the profiler waits.
        """
        if self.recording and self._state == "running" and self.schedule.is_traced(self.steps_done):
            if self._nvtx is not None:
                return self._nvtx(name)
            return self._record_function(name)
        return _NULL_CONTEXT

    def close(self) -> None:
        """Stop profiling, export what exists and finish the manifest; safe to call more than once."""
        self._quiet_until = 0
        if self._state != "running":
            self._state = "closed"
            return
        self._state = "closed"
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)
        if not self.recording or self._ctx is None:
            return
        try:
            self._finish()
        finally:
            _release(self)

    def _finish(self) -> None:
        assert self._ctx is not None and self._writer is not None
        self._ctx.step = self.steps_done
        trace = self._trace
        if trace is not None and trace.name not in self._guard.failed:
            if _thread_id() != self._owner:
                self._drop_other_threads_window(trace)
            else:
                self._guard.call(trace, "close")  # a partial last window still reaches the others
            window = trace.take_window()
            if window is not None:
                for hook in self._on_window:
                    hook(window)
        if self._auto is not None:
            with contextlib.suppress(Exception):
                self._auto.close()
        for collector in self._collectors:
            if collector is trace or collector.name in self._guard.failed:
                continue
            self._guard.call(collector, "close")
        notes = []
        if self.config.on_demand:
            if not self._windows_planned:
                notes.append(
                    "on_demand: no window was requested while the job ran (stepscope trigger RUN_DIR, or "
                    "SIGUSR2 to a profiled rank)"
                )
        elif (trace is None or not trace.windows_ended) and (
            note := self.schedule.short_job_note(self.steps_done)
        ) is not None:
            notes.append(note)
            warn_user(f"stepscope: {note}", StepscopeWarning)
        self._flush_metrics()
        self._writer.update(notes=notes)
        if not self._writer.close():  # the manifest lock stayed held, or the manifest could not be written
            return  # (said once); the report would wait for the same lock
        if self.config.report and self._ctx.is_first_profiled_rank:
            from stepscope.capture.output.report import write_run_report

            write_run_report(self._ctx.run_dir, console=self.config.console)

    def _drop_other_threads_window(self, trace: Any) -> None:
        """close() on a thread other than the monitor's: a window still open there is dropped, stopped on its
        own thread (stopping torch's profiler from another thread crashes the process: trace.close_elsewhere)."""
        if trace.dropped_window:
            warn_user(
                f"stepscope: the monitor is closed on {threading.current_thread().name}, not on "
                f"{self._owner_name} whose profiler recorded the window still open; that window is dropped "
                "(close the monitor on the thread that steps it to keep it)",
                StepscopeWarning,
            )
        self._guard.call(trace, "close_elsewhere")  # the windows exported before are finished all the same

    # --- lifecycle --------------------------------------------------------------------------------
    def _resolve_identity(self) -> None:
        from stepscope.capture.output.dist import run_folder  # (hashlib, datetime: not at `import stepscope`)

        self.rank, self.world_size, self._run_dir = run_folder(Path(self.config.out_dir), self._index)

    def _profiled_ranks(self) -> list[int] | None:
        """The profiled ranks of the job; None for "all". Nothing here is sized by the world size: that is a
        number from the environment when there is no process group (WORLD_SIZE=100000000 must cost nothing)."""
        ranks = self.config.profiled_ranks
        return None if ranks == "all" else sorted(r for r in ranks if r < self.world_size)

    def _start_safely(self) -> None:
        """`_start`, where any error of stepscope's own switches profiling off with a warning."""
        try:
            self._start()
        except Exception as exc:
            self.recording = False
            self._quiet_until = 0
            _release(self)
            for collector in self._collectors:  # release what did start (a running profiler, a thread)
                with contextlib.suppress(Exception):
                    collector.close()
            warn_user(
                f"stepscope: profiling could not start ({type(exc).__name__}: {exc}); it is switched off for "
                "this run, training goes on",
                StepscopeWarning,
            )

    def _start(self) -> None:
        global _recording
        self._state = "running"
        if self._run_dir is None:
            self._resolve_identity()
        profiled = self._profiled_ranks()
        if profiled is not None and self.rank not in profiled:
            return  # this rank pays nothing more
        if _recording is not None and _recording is not self:
            warn_user(
                "stepscope: another monitor is already recording in this process "
                f"({_recording.run_dir}); torch runs one profiler at a time, so this monitor records nothing "
                "(training goes on)",
                StepscopeWarning,
            )
            return
        assert self._run_dir is not None
        try:
            self._ctx = open_context(
                self._run_dir,
                self.config,
                self.schedule,
                self.rank,
                self.world_size,
                profiled,
                model=self.model,
                engine=self.engine,
                steps_done=lambda: self.steps_done,
            )
        except Exception as exc:
            cause = (
                exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
            )
            warn_user(
                f"stepscope: cannot write the run folder {self._run_dir} ({cause}); profiling is "
                "switched off for this run, training goes on",
                StepscopeWarning,
            )
            return
        from torch.profiler import record_function

        self._writer = self._ctx.writer
        self._quiet = self._writer.quiet_buffer
        self._record_function = record_function
        self.recording = True
        _recording = self
        requesters = self.world_size if profiled is None else len(profiled)
        self._collectors, self._trace = make_collectors(
            self._ctx, deepspeed=self.engine is not None, replan=self._replan, requesters=requesters
        )
        for collector in self._collectors:
            self._guard.call(collector, "start")
        self._rebuild_hooks()
        if self.config.watch:
            assert self._ctx is not None
            self._auto = make_watch(self._ctx, self._live(), self._trace)
            self._watch_at = self._auto.next_check if self._auto is not None else NEVER
        nsight = next((c for c in self._live() if c.name == "nsight"), None)
        if nsight is not None and getattr(nsight, "cuda", False):
            from stepscope.capture.collectors.nsight import nvtx_region

            self._nvtx = nvtx_region
        self._quiet_until = self._next_busy(self.steps_done)
        atexit.register(self.close)

    def _live(self) -> list[Collector]:
        return [c for c in self._collectors if c.name not in self._guard.failed]

    def _rebuild_hooks(self) -> None:
        live = self._live()
        trace = self._trace if self._trace in live else None
        others = [c for c in live if c is not trace]
        if self._writer is not None:
            self._writer.quiet_outside_windows = trace is not None
        call = self._guard.call

        def hooks(hook: str, collectors: list[Collector]) -> list[Any]:
            return [functools.partial(call, c, hook) for c in collectors if overrides(c, hook)]

        # The trace collector opens a step first and closes it last: the others' work lies inside its span.
        self._before = hooks("before_step", ([trace] if trace else []) + others)
        self._after = hooks("after_step", others + ([trace] if trace else []))
        self._on_record = hooks("on_record", others) + [
            functools.partial(self._tell_listener, listener) for listener in self._listeners
        ]
        self._on_window = hooks("on_window", others)
        self._failed_hooks = hooks("step_failed", live)

    def _tell_listener(self, listener: Callable[[StepMetrics], Any], line: StepMetrics) -> None:
        try:
            listener(line)
        except Exception as exc:
            with contextlib.suppress(ValueError):
                self._listeners.remove(listener)
            self._rebuild_hooks()
            warn_user(
                f"stepscope: a step listener failed ({type(exc).__name__}: {exc}); it is dropped, training "
                "goes on",
                StepscopeWarning,
            )

    def _replan(self, schedule: Schedule) -> None:
        """An on-demand window was requested: from now on the collectors follow `schedule` (the trigger
        collector calls this at the step where it saw the request, before that step runs, and notes it)."""
        ctx, writer = self._ctx, self._writer
        assert ctx is not None and writer is not None
        self.schedule = ctx.schedule = writer.schedule = schedule
        self._windows_planned += 1

    def _next_busy(self, step: int) -> int:
        """The first step >= `step` at which some live collector works."""
        busy = NEVER
        for collector in self._live():
            try:
                busy = min(busy, collector.next_busy(step))
            except Exception as exc:
                self._guard.disable(collector, "next_busy", exc)
                return step
        return busy

    def _on_disable(self, collector: Collector) -> None:
        # Release what the failed collector holds (a running profiler, a thread), silently.
        with contextlib.suppress(Exception):
            release = getattr(collector, "abandon", None) or collector.close
            release()
        self._rebuild_hooks()


def _release(monitor: PerformanceMonitor) -> None:
    global _recording
    if _recording is monitor:
        _recording = None


def performance_monitor(model: Any = None, **options: Any) -> PerformanceMonitor:
    """Create a monitor: use it as `@monitor` on a train-step function, or `with monitor:` plus `monitor.step()`.

    Options are those of `stepscope.ProfileConfig` (pass `config=` a ProfileConfig or YAML path; keyword
    arguments override it). With `enabled=False` the decorator returns the function itself.
    """
    return PerformanceMonitor(model, **options)


__all__ = ["PerformanceMonitor", "performance_monitor"]
