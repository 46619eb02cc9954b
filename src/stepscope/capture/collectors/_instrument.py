"""Helpers shared by the collectors that instrument one step (FLOP counter, collective logger).

Placement: a dispatch mode inside a traced step makes the profiler record every aten op twice and slows the
step (TORCH-NOTES), so an instrumented step is moved to the first untraced step at or after the requested one.
Module names: torch's module trackers name modules after the class of the outermost module called (e.g.
`DistributedDataParallel.module.0`); with the user's model we turn them into the model's own names (`0`).
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from stepscope.capture.collector import RunContext
from stepscope.capture.console import StepscopeWarning, warn_user
from stepscope.capture.schedule import Schedule

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
GLOBAL = "Global"  # the trackers' name for everything that ran, inside a module or not


def quiet_module_tracker() -> None:
    """Silence the warning torch's module trackers (FlopCounterMode, CommDebugMode) cause in a backward
    whose inputs need no grad: it is about our hooks, not the user's code."""
    warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed")


def strip_ansi(text: str) -> str:
    """`text` without terminal colour/control sequences (CommDebugMode colours its table)."""
    return _ANSI.sub("", text)


def untraced_step_from(schedule: Schedule, step: int) -> int | None:
    """The first step >= `step` outside every warmup/active window; None when every later step is traced."""
    if not schedule.is_traced(step):
        return step
    if schedule.repeat == 0 and schedule.wait == 0:
        return None  # from skip_first on, every step is warmup or active forever
    return schedule.first_untraced_step_from(step)


def _traced_span(schedule: Schedule, step: int) -> tuple[int, int]:
    first = last = step
    while first > 0 and schedule.is_traced(first - 1):
        first -= 1
    while schedule.is_traced(last + 1) and last - step < 1_000_000:
        last += 1
    return first, last


def planned_steps(
    schedule: Schedule, flop_request: int | None, comm_request: int | None
) -> tuple[int | None, int | None]:
    """(FLOP step, comm step): each outside every traced window, and never the same step (each collector
    enters its dispatch mode before and leaves it after the step, in the same hook order, so two would not
    nest)."""
    flop = untraced_step_from(schedule, flop_request) if flop_request is not None else None
    comm = untraced_step_from(schedule, comm_request) if comm_request is not None else None
    if comm is not None and comm == flop:
        comm = untraced_step_from(schedule, comm + 1)
    return flop, comm


def announce_placement(
    ctx: RunContext, option: str, requested: int | None, placed: int | None, what: str
) -> None:
    """Warn once (and note it in the manifest) when a requested step was moved or cannot be placed."""
    if requested is None or placed == requested:
        return
    schedule = ctx.schedule
    if placed is None:
        note = (
            f"{option}={requested} cannot lie outside the profiler's windows: with repeat=0 and wait=0 every "
            f"step from {schedule.skip_first} on is warmup or active; {what} is skipped (set wait >= 1, "
            f"repeat >= 1, or {option} < skip_first)"
        )
    elif schedule.is_traced(requested):
        first, last = _traced_span(schedule, requested)
        note = (
            f"{option}={requested} falls inside a traced window (steps {first}-{last}), where the profiler "
            f"would record every op twice and the step would run ~2x slower; {what} runs at step {placed} instead"
        )
    else:
        note = (
            f"{option}={requested} is the FLOP counter's step too, and the two cannot share one; {what} runs at "
            f"step {placed} instead"
        )
    warn_user(f"stepscope: {note}", StepscopeWarning)
    with contextlib.suppress(OSError):
        ctx.writer.update(notes=[f"rank {ctx.rank}: {note}"])


@dataclass(frozen=True)
class ModuleNames:
    """Maps tracker names onto the model's own module names (`""` is the model itself)."""

    root: str | None  # the tracker's name of the model; None: no model, or not seen
    model_type: str | None
    types: dict[str, str]  # model-relative name -> class name
    order: dict[str, int]  # model-relative name -> position in model.named_modules()

    @classmethod
    def build(cls, tracker_names: Iterable[str], model: Any) -> ModuleNames:
        names = [n for n in tracker_names if n != GLOBAL]
        model = unwrap(model)
        if model is None or not hasattr(model, "named_modules"):
            return cls(None, None, {}, {})
        modules = list(model.named_modules())
        types = {name: type(mod).__name__ for name, mod in modules}
        order = {name: i for i, (name, _) in enumerate(modules)}
        return cls(_find_root(names, model), type(model).__name__, types, order)

    def relative(self, tracker_name: str) -> str | None:
        """The model-relative name; None for names outside the model (wrappers, other modules)."""
        if self.root is None:
            return tracker_name
        if tracker_name == self.root:
            return ""
        if tracker_name.startswith(self.root + "."):
            return tracker_name[len(self.root) + 1 :]
        return None

    def label(self, relative: str) -> str:
        if self.root is None:
            return relative
        return f"{self.model_type} (model)" if relative == "" else relative

    def depth(self, relative: str) -> int:
        """1 for the model, 2 for its children, ... (without a model: 1 for the outermost modules)."""
        if self.root is not None and relative == "":
            return 1
        return relative.count(".") + (2 if self.root is not None else 1)

    def sort_key(self, relative: str) -> tuple[int, str]:
        return (self.order.get(relative, len(self.order)), relative)


# Wrappers whose `.module` is the user's model (DDP, FSDP v1, DataParallel); torch.compile's OptimizedModule keeps
# it in `._orig_mod`. FSDP2 (fully_shard) changes the model in place and needs none.
WRAPPERS = ("DistributedDataParallel", "FullyShardedDataParallel", "DataParallel")


def unwrap(model: Any) -> Any:
    """The model inside DDP / FSDP / DataParallel / torch.compile wrappers (any nesting), so that tables list
    its own modules at the default depth instead of the wrapper alone."""
    for _ in range(8):
        inner = getattr(model, "_orig_mod", None)
        if inner is None and type(model).__name__ in WRAPPERS:
            inner = getattr(model, "module", None)
        if inner is None:
            return model
        model = inner
    return model


def _find_root(names: list[str], model: Any) -> str | None:
    """The tracker's name of `model`: the shallowest name whose children include the model's children."""
    present = set(names)
    children = [name for name, _ in model.named_children()]
    ordered = sorted(present, key=lambda n: (n.count("."), n))
    for name in ordered:
        if children and any(f"{name}.{child}" in present for child in children):
            return name
    model_type = type(model).__name__
    for name in ordered:
        if name == model_type or name.endswith(".module"):
            return name
    return None
