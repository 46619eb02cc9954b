"""Collectors: the pieces of capture (trace, metrics, FLOPs, memory, ...) and the context they share.

A collector overrides only the hooks it needs; the monitor calls just those, each through a guard that
turns an exception into one warning and switches that collector off. Profiling never takes a job down.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from stepscope.runfolder import METRICS_NAME, Artifact, relpath, update_manifest

if TYPE_CHECKING:
    from stepscope.capture.schedule import Schedule
    from stepscope.config import ProfileConfig


class StepscopeWarning(UserWarning):
    """Warnings stepscope emits while a job runs (a collector switched off, a short job, ...)."""


@dataclass
class RunContext:
    """What every collector of one recording rank shares: options, identity, the run folder, outputs."""

    config: ProfileConfig
    schedule: Schedule
    rank: int
    world_size: int
    run_dir: Path
    model: Any = None
    is_first_profiled_rank: bool = False
    step: int = 0  # index of the step that is running (0-based); equals steps completed so far
    # Called by the trace collector with (profiler, step) after it exported a window (see Collector.window_ready).
    window_listeners: list[Callable[[Any, int], Any]] = field(default_factory=list)
    _metrics: list[bytes] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _listeners: list[Callable[[str, dict[str, Any]], None]] = field(default_factory=list)

    def add_artifact(
        self, kind: str, path: str | Path, step: int | None = None, rank: int | None = -1
    ) -> None:
        """Index a written file in the manifest (rank defaults to this rank; pass None for job-wide files)."""
        artifact = Artifact(
            kind=kind, path=relpath(self.run_dir, path), rank=self.rank if rank == -1 else rank, step=step
        )
        with self._lock:
            update_manifest(self.run_dir, artifacts=[artifact])

    def path(self, relative: str) -> Path:
        """Absolute path in the run folder; parent folders are created."""
        target = self.run_dir / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        return target

    def log_metrics(self, record: dict[str, Any]) -> None:
        """Queue one JSON line for metrics.jsonl (flushed at window ends and at close)."""
        self._metrics.append(msgspec.json.encode(record) + b"\n")

    def subscribe(self, listener: Callable[[str, dict[str, Any]], None]) -> None:
        """Call `listener(event, data)` for every `notify` (collectors that consume others' results)."""
        self._listeners.append(listener)

    def notify(self, event: str, **data: Any) -> None:
        """Tell the listeners about an event; one that raises is dropped with a warning, never the caller.

        Events carry results for other collectors: "window_end" (step, averages, sort_key, trace_path) from
        the trace collector once a window's key averages exist (work that needs the profiler itself belongs in
        `window_ready`); "throughput" (step, throughput) from the FLOP collector when it has a figure.
        """
        for listener in list(self._listeners):
            try:
                listener(event, data)
            except Exception as exc:
                self._listeners.remove(listener)
                warnings.warn(
                    f"stepscope: a listener of {event!r} failed ({type(exc).__name__}: {exc}); it is dropped",
                    StepscopeWarning,
                    stacklevel=2,
                )

    def flush_metrics(self) -> None:
        if not self._metrics:
            return
        data = b"".join(self._metrics)
        self._metrics.clear()
        # One O_APPEND write per flush: lines of different ranks never interleave mid-line.
        fd = os.open(self.run_dir / METRICS_NAME, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)


class Collector:
    """Base of all collectors. Hooks left as defined here are never called (zero cost on the hot path)."""

    name = "collector"
    close_order = 0  # lower closes first: the trace collector (-1) exports its last window to the others

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx

    def start(self) -> None:
        """Called once before the first step."""

    def before_step(self, step: int) -> None:
        """Called before step `step` runs."""

    def after_step(self, step: int, record: dict[str, Any]) -> None:
        """Called after step `step`; may add fields to `record` (its metrics.jsonl line)."""

    def step_failed(self, step: int, exc: BaseException) -> None:
        """Called when step `step` raised `exc` (before it propagates), e.g. to dump a snapshot on OOM."""

    def window_ready(self, prof: Any, step: int) -> None:
        """Called after the trace collector exported the window ending at `step`, with its torch profiler
        (the profiler is not recording then: work done here is not in any step's trace)."""

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
        warnings.warn(
            f"stepscope: the {collector.name!r} collector failed in {hook} ({cause}); it is switched off for the "
            "rest of the run, training goes on",
            StepscopeWarning,
            stacklevel=3,
        )
        if self.on_disable is not None:
            self.on_disable(collector)
