"""A DeepSpeed engine given to the monitor: its optimizer steps are the monitor's steps.

`performance_monitor(engine)` starts at once and ends a step each time the engine's `global_steps` moves: after
an `engine.step()` at a gradient-accumulation boundary (the micro-batches before it are inside that step), or
after a PipelineEngine's `train_batch()`. Nothing else in the loop changes. The engine is recognised without
importing deepspeed: an engine exists only once the job imported it.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

# The engine methods after which `global_steps` may have moved (PipelineEngine.train_batch steps the optimizer
# itself, not through step()).
STEPPING_METHODS = ("step", "train_batch")


def is_deepspeed_engine(obj: Any) -> bool:
    """Whether `obj` is a DeepSpeed engine (DeepSpeedEngine or a subclass: PipelineEngine, ...)."""
    if obj is None or "deepspeed" not in sys.modules:
        return False
    try:
        from deepspeed.runtime.engine import DeepSpeedEngine
    except Exception:  # a deepspeed that cannot import its engine made none
        return False
    return isinstance(obj, DeepSpeedEngine)


def engine_of(module: Any) -> Any:
    """The DeepSpeed engine that wraps `module`, or None: for a framework that keeps the engine where its callbacks
    cannot see it (the HF Trainer hands them the bare model). Looked up once among the objects that refer to the
    module (the engine holds it in its `_modules`, which its `__dict__` holds): a few scans of the heap."""
    if is_deepspeed_engine(module):
        return module
    if module is None or "deepspeed" not in sys.modules:
        return None
    import gc

    holders = [module]
    for _ in range(3):  # module <- engine._modules <- engine.__dict__ <- engine, at most
        found = []
        for holder in holders:
            for referrer in gc.get_referrers(holder):
                if is_deepspeed_engine(referrer) and getattr(referrer, "module", None) is module:
                    return referrer
                if isinstance(referrer, dict):
                    found.append(referrer)
        holders = found
    return None


def model_of(engine: Any) -> Any:
    """The user's module inside the engine (what the FLOP and module tables name)."""
    return getattr(engine, "module", engine)


def follow_engine(monitor: Any, engine: Any) -> None:
    """Make `monitor`'s steps follow `engine`'s optimizer steps from now on (`global_steps` numbers them): the
    monitor starts here, the engine's step ends each step, and the user's own `monitor.step()` calls (one per
    micro-batch, say) are ignored, so a loop written for the monitor counts the same steps."""
    monitor.model = model_of(engine)
    end_step = functools.partial(type(monitor).step, monitor)
    monitor.step = _ignored_step
    drive(engine, end_step)
    monitor.start(first_step=int(engine.global_steps))


def _ignored_step() -> None:
    """`step()` of a monitor that follows a DeepSpeed engine: the engine's optimizer steps end the steps."""


def drive(engine: Any, end_step: Callable[[], None]) -> None:
    """Call `end_step()` after each call of the engine's stepping methods that moved `engine.global_steps`.

    The wrappers are instance attributes over the engine's methods (the class is left alone): each costs one
    attribute read and a comparison per call."""
    depth = [0]  # a stepping method called inside another (train_batch -> step) ends no step of its own
    for name in STEPPING_METHODS:
        original = getattr(engine, name, None)
        if original is None or not callable(original):
            continue
        engine.__dict__[name] = _stepping(engine, original, end_step, depth)


def _stepping(
    engine: Any, original: Callable[..., Any], end_step: Callable[[], None], depth: list[int]
) -> Callable[..., Any]:
    @functools.wraps(original)
    def stepped(*args: Any, **kwargs: Any) -> Any:
        before = engine.global_steps
        depth[0] += 1
        try:
            result = original(*args, **kwargs)
        finally:
            depth[0] -= 1
        if not depth[0] and engine.global_steps != before:
            end_step()
        return result

    return stepped
