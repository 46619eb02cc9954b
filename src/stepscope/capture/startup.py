"""What a monitor makes when it starts recording on a rank: its run context (the run folder opened, its metrics
file, the manifest merged at once) and its collectors, each of which may fail to set up alone."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from stepscope.capture.collector import Collector, RunContext
from stepscope.capture.collectors import collector_classes
from stepscope.capture.config import ProfileConfig
from stepscope.capture.console import StepscopeWarning, warn_user
from stepscope.capture.output.writer import open_run_folder
from stepscope.capture.schedule import Schedule


def open_context(
    run_dir: Path,
    config: ProfileConfig,
    schedule: Schedule,
    rank: int,
    world_size: int,
    profiled: list[int] | None,
    *,
    model: Any,
    engine: Any,
    steps_done: Callable[[], int],
) -> RunContext:
    """The run folder opened for this rank (OSError and others when it cannot be written) and what the
    collectors share. `profiled`: the profiled ranks, None for all."""
    writer = open_run_folder(run_dir, config, schedule, rank, world_size, profiled)
    try:
        writer.create_metrics()
    except OSError as exc:  # a FIFO or a device put in its place: metrics are off, the rest goes on
        writer.metrics_failed(exc)
    writer.manifest.merge_now()  # the folder is a run folder at once, unless another process holds the lock
    return RunContext(
        config=config,
        schedule=schedule,
        rank=rank,
        world_size=world_size,
        writer=writer,
        model=model,
        engine=engine,
        is_first_profiled_rank=rank == (0 if profiled is None else profiled[0]),
        step=steps_done(),
        steps_done=steps_done,
    )


def make_collectors(
    ctx: RunContext, *, deepspeed: bool, replan: Callable[[Schedule], None], requesters: int
) -> tuple[list[Collector], Any]:
    """The collectors the config asks for, and the trace collector among them (None without one). One that cannot
    be set up is left out with a warning; `replan` and `requesters` (the ranks that claim an on-demand window)
    serve the on-demand collector."""
    from stepscope.capture.window.trace import TraceCollector

    config = ctx.config
    classes: list[type[Collector]] = [*collector_classes(config, deepspeed=deepspeed)]
    if config.trace:
        classes.append(TraceCollector)
    collectors: list[Collector] = []
    for cls in classes:
        try:
            collectors.append(cls(ctx))
        except Exception as exc:
            warn_user(
                f"stepscope: the {cls.name!r} collector could not be set up ({type(exc).__name__}: {exc}); "
                "it is switched off for this run, training goes on",
                StepscopeWarning,
            )
    if config.on_demand or config.watch:
        from stepscope.capture.window.trigger import TriggerCollector

        collectors.append(TriggerCollector(ctx, replan, requesters))
    return collectors, next((c for c in collectors if isinstance(c, TraceCollector)), None)


def make_watch(ctx: RunContext, live: list[Collector], trace: Any) -> Any:
    """The watch of a monitor with watch=True (capture/window/auto.py), which looks for requests itself at its
    checks; None, said once, when the trace collector (`trace`, among the `live` collectors) did not start."""
    from stepscope.capture.window.auto import AutoWindows
    from stepscope.capture.window.trigger import TriggerCollector

    trigger = next((c for c in live if isinstance(c, TriggerCollector)), None)
    if trigger is None or trace is None or trace not in live:
        warn_user(
            "stepscope: watch: the trace collector did not start, so the watch has no window to open; it is "
            "off for this run, training goes on",
            StepscopeWarning,
        )
        return None
    trigger.polled_by_watch = True
    return AutoWindows(ctx, trigger, trace)
