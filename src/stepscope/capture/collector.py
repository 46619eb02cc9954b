"""Collectors: the pieces of capture (trace, metrics, FLOPs, memory, ...) and what they share.

A collector overrides only the hooks it needs and says at which steps it needs them (`next_busy`); the monitor
calls just those, each through a guard that turns an exception into one warning and switches that collector
off. A step no collector needs costs a counter and a comparison. Profiling never takes a job down.

Hooks, in the order the monitor calls them within a step:
    before_step(step)                 before the step runs (the trace collector's first)
    after_step(step, wall_ms)         after it; returns fields for the step's metrics line, or None
    on_record(line)                   the step's assembled StepMetrics line (sinks)
    on_window(window)                 once per exported window, after the trace collector's after_step
    step_failed(step, exc)            the step raised (before the exception propagates), on every step
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stepscope.capture.console import StepscopeWarning, warn_user
from stepscope.capture.schedule import NEVER_STEP as NEVER

if TYPE_CHECKING:
    from stepscope.capture.config import ProfileConfig
    from stepscope.capture.output.writer import RunWriter
    from stepscope.capture.schedule import Schedule
    from stepscope.runfolder.payloads import StepMetrics


@dataclass
class RunContext:
    """What every collector of one recording rank shares: options, identity, the run writer."""

    config: ProfileConfig
    schedule: Schedule
    rank: int
    world_size: int
    writer: RunWriter
    model: Any = None
    engine: Any = None  # a DeepSpeed engine given to the monitor (`model` is then its module)
    is_first_profiled_rank: bool = False
    step: int = 0  # steps completed so far (= index of the step that runs next)
    # the monitor's count of steps completed, read from any thread (`step` follows it only at busy steps)
    steps_done: Callable[[], int] = lambda: 0

    @property
    def run_dir(self) -> Path:
        return self.writer.run_dir


@dataclass(frozen=True)
class Window:
    """One exported profiling window of one rank: what collectors that work per window receive."""

    rank: int
    first_step: int  # first active step
    last_step: int  # last active step (the window's trace is named after it)
    trace_path: Path
    profiler: Any  # the stopped torch profiler (export_memory_timeline etc. still work on it)
    # its top ops and kernels (a capture.window.window_end.TopOps), once the worker has read the trace: None when it
    # could not; add_done_callback runs on the worker's thread, or at once when they are known
    top_ops: Future[Any] | None = None
    partial: bool = False  # the job stopped inside the window
    notes: list[str] = field(default_factory=list)


class Collector:
    """Base of all collectors. Hooks left as defined here are never called (zero cost on the hot path)."""

    name = "collector"

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx

    def start(self) -> None:
        """Called once before the first step."""

    def next_busy(self, step: int) -> int:
        """The first step >= `step` at which before_step / after_step must run (NEVER: no more).

        The default is every step when either hook is overridden; collectors that work at a few steps say
        which, so that the steps in between cost nothing."""
        return step if overrides(self, "before_step") or overrides(self, "after_step") else NEVER

    def before_step(self, step: int) -> None:
        """Called before step `step` runs (at busy steps)."""

    def after_step(self, step: int, wall_ms: float) -> Mapping[str, Any] | None:
        """Called after step `step` (at busy steps); returns fields for its metrics line."""
        return None

    def on_record(self, line: StepMetrics) -> None:
        """Called with every metrics line of a busy step, once assembled."""

    def on_window(self, window: Window) -> None:
        """Called once per exported window (the profiler is not recording then: work done here is not in
        any step's trace)."""

    def step_failed(self, step: int, exc: BaseException) -> None:
        """Called when step `step` raised `exc` (before it propagates), e.g. to dump a snapshot on OOM."""

    def close(self) -> None:
        """Called once when the monitor stops (also after a failure elsewhere)."""


def overrides(collector: Collector, hook: str) -> bool:
    return getattr(type(collector), hook) is not getattr(Collector, hook)


class Guard:
    """Runs collector hooks; the first exception of a collector warns once and switches it off."""

    def __init__(self) -> None:
        self.failed: dict[str, str] = {}
        self.on_disable: Callable[[Collector], None] | None = None

    def call(self, collector: Collector, hook: str, *args: Any) -> Any:
        if collector.name in self.failed:
            return None
        try:
            return getattr(collector, hook)(*args)
        except Exception as exc:
            self.disable(collector, hook, exc)
            return None

    def disable(self, collector: Collector, hook: str, exc: BaseException) -> None:
        if collector.name in self.failed:
            return
        cause = f"{type(exc).__name__}: {exc}".strip()
        self.failed[collector.name] = cause
        warn_user(
            f"stepscope: the {collector.name!r} collector failed in {hook} ({cause}); it is switched off for the "
            "rest of the run, training goes on",
            StepscopeWarning,
        )
        if self.on_disable is not None:
            self.on_disable(collector)
