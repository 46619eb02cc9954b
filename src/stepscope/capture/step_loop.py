"""The monitor's step loop: how a step ends and the next begins, quiet (no collector works: a clock read and an
append, the whole cost of a step while the monitor waits) or busy (the collectors' hooks, the step's metrics line,
a window handed on). `PerformanceMonitor` (monitor.py) has it as a base; its lifecycle (start, close) and the
hooks' lists are made there."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

from stepscope.capture.collector import RunContext
from stepscope.capture.console import StepscopeWarning, warn_user
from stepscope.capture.output.writer import METRICS_FLUSH_LINES, RunWriter
from stepscope.capture.schedule import NEVER_STEP, Phase, Schedule
from stepscope.runfolder.payloads import StepMetrics

# a step's metrics line says monitor_ms from this much on (a window's end: tens of ms and up)
MONITOR_MS_SHOWN = 1.0
_perf_ns = time.perf_counter_ns
_thread_id = threading.get_ident


class StepLoop:
    """The steps of a monitor (see the module's doc); the state it reads is the monitor's."""

    schedule: Schedule
    rank: int
    steps_done: int
    _ctx: RunContext | None
    _writer: RunWriter | None
    _trace: Any
    _before: list[Callable[[int], Any]]
    _after: list[Callable[[int, float], Any]]
    _on_record: list[Callable[[StepMetrics], Any]]
    _on_window: list[Callable[[Any], Any]]
    _failed_hooks: list[Callable[[int, BaseException], Any]]
    _step_start: int
    _quiet_until: int
    _quiet: list[tuple[int, int]]
    _owner: int
    _owner_name: str
    _other_threads: bool
    _open: int | None
    _start_lock: threading.Lock
    # the watch (config watch=True, capture/window/auto.py): a quiet step slower than _watch_ns, and the step
    # _watch_at, are handed to it; without a watch both are out of reach
    _auto: Any = None
    _watch_ns: int = NEVER_STEP
    _watch_at: int = NEVER_STEP

    def _next_busy(self, step: int) -> int:
        raise NotImplementedError  # (the monitor's: the first step >= `step` at which a collector works)

    def _begin_step(self) -> None:
        self._step_start = _perf_ns()
        step = self.steps_done
        if step < self._quiet_until:
            return
        if _thread_id() != self._owner:  # the owner's next step end begins one (see _end_busy_step)
            self._open = None
            return
        for hook in self._before:
            hook(step)
        self._open = step

    def _step_on_other_thread(self) -> None:
        """A busy step ended on a thread other than the monitor's: it is counted (a metrics line with its
        wall time), no collector works at it."""
        with self._start_lock:  # two threads may get here together: one warns
            first, self._other_threads = not self._other_threads, True
        if first:
            warn_user(
                f"stepscope: steps end on more than one thread ({threading.current_thread().name} and "
                f"{self._owner_name}, which started the monitor); torch's profiler records the thread that starts "
                f"it, so only the steps of {self._owner_name} are profiled; the others are counted (training "
                "goes on)",
                StepscopeWarning,
            )
        # the owner's step stays open (_open): no step begins here, whatever the next one is
        self._end_quiet_step(self.steps_done, begin_next=False)

    def _end_quiet_step(self, step: int, begin_next: bool = True) -> None:
        """Step `step` ended and no collector worked at it: its wall time joins the writer's buffer (the metrics
        line is formatted at the flush). The next step begins: by the collectors' before_step hooks when it is
        busy and `begin_next`, else by a clock read alone. The only work of a step while the monitor waits."""
        now = _perf_ns()
        wall = now - self._step_start
        quiet = self._quiet
        quiet.append((step, wall))
        self.steps_done = step + 1
        if wall > self._watch_ns or step >= self._watch_at:
            self._watch_step(step, wall)
        step += 1
        if len(quiet) >= METRICS_FLUSH_LINES:
            self._flush_metrics()
        if step < self._quiet_until or not begin_next:  # the next step is quiet too, or begins elsewhere
            self._step_start = now
        else:
            self._begin_step()

    def _step_failed(self, step: int, exc: BaseException) -> None:
        for failed in self._failed_hooks:
            failed(step, exc)

    def _end_busy_step(self) -> None:
        ended = _perf_ns()
        wall_ns = ended - self._step_start
        step = self.steps_done
        if step < self._quiet_until:  # (start() of a context-manager monitor whose step 0 is quiet)
            self._quiet.append((step, wall_ns))
            self.steps_done = step + 1
            return
        wall_ms = wall_ns / 1e6
        phase = self.schedule.phase(step)
        hook_step = self._owner_step(step) if self._other_threads else step
        if hook_step is None:  # no collector began this step (another thread ended the one before)
            self._quiet.append((step, wall_ns))
            self.steps_done = step + 1
            return
        self._open = None
        fields: dict[str, Any] = {}
        for hook in self._after:
            out = hook(hook_step, wall_ms)
            if out:
                fields.update(out)
        self.steps_done = step + 1
        ctx, writer = self._ctx, self._writer
        assert ctx is not None and writer is not None
        ctx.step = self.steps_done
        window = self._trace.take_window() if self._trace is not None else None
        if window is not None:
            for window_hook in self._on_window:
                window_hook(window)
        # what the job waited for in stepscope after its step (a window's stop and export, the hooks above)
        monitor_ms = (_perf_ns() - ended) / 1e6
        line: StepMetrics | None = None
        try:
            line = StepMetrics(
                step=step, rank=self.rank, wall_ms=wall_ms, phase=phase.value,
                monitor_ms=round(monitor_ms, 3) if monitor_ms >= MONITOR_MS_SHOWN else None, **fields,
            )  # fmt: skip
        except Exception as exc:  # a field a collector returned that the metrics line does not have
            writer.metrics_failed(exc)
        if line is not None:
            for record_hook in self._on_record:
                record_hook(line)
            writer.step_line(line)  # (kept only while metrics are on)
        if writer.pending >= METRICS_FLUSH_LINES or phase is Phase.RECORD_AND_SAVE:
            self._flush_metrics()
        if step >= self._watch_at:  # (a busy step is not judged: its collectors' work is in its time)
            self._watch_step(step, 0)
        self._quiet_until = self._next_busy(step + 1)

    def _watch_step(self, step: int, wall_ns: int) -> None:
        """Hand step `step` to the watch; a window it plans begins at the next step at the soonest."""
        auto = self._auto
        try:
            if auto.step(step, wall_ns, self._quiet):
                self._quiet_until = self._next_busy(step + 1)
            self._watch_ns, self._watch_at = auto.over_ns, auto.next_check
        except Exception as exc:
            self._watch_failed(exc)

    def _watch_failed(self, exc: BaseException) -> None:
        """The watch raised: it is switched off, said once (an on-demand run still answers requests)."""
        auto, self._auto = self._auto, None
        self._watch_ns = self._watch_at = NEVER_STEP
        if auto is None:
            return
        auto.trigger.polled_by_watch = False
        with contextlib.suppress(Exception):
            auto.close()
        self._quiet_until = min(self._quiet_until, self._next_busy(self.steps_done))
        warn_user(
            f"stepscope: the watch failed ({type(exc).__name__}: {exc}); it is switched off for this run, "
            "training goes on",
            StepscopeWarning,
        )

    def _owner_step(self, step: int) -> int | None:
        """The step the collectors end at the owner's busy step `step` when other threads also end steps: the
        steps they ended since this one began are not the profiler's, so its window ends at its last step at
        the latest (its trace is named after it), and a step begun outside the windows ends outside them."""
        begun = self._open
        if begun is None:
            return None
        if self.schedule.phase(begun) is Phase.NONE:
            return begun
        return min(step, self.schedule.window_end(begun))

    def _flush_metrics(self) -> None:
        if self._writer is not None:
            self._writer.flush_metrics_or_switch_off()
