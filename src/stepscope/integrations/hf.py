"""Hugging Face Trainer: `Trainer(..., callbacks=[StepscopeCallback()])` profiles the training.

A step is an optimizer step (gradient accumulation respected) and carries the number the Trainer logs it with
(`state.global_step` once it is done: 1, 2, ...), also when training resumes from a checkpoint. Every rank runs the callback; the monitor decides which ranks
record (`profiled_ranks`). The run folder goes under `args.output_dir/stepscope` unless `out_dir` is given.
After each window the headline numbers (`stepscope/step_ms`, and `stepscope/tflops` / `stepscope/mfu` when FLOPs
are counted) go into the Trainer's next log, so they reach the loggers of `report_to` and `trainer.state.log_history`.

Needs `transformers` (pip install 'stepscope[hf]'); importing this module without it says so.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import FrameType
from typing import Any

from stepscope.capture.config import ProfileConfig
from stepscope.capture.engine import engine_of
from stepscope.capture.monitor import PerformanceMonitor
from stepscope.integrations._common import PREFIX, Headline, resolve_options, use_engine

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("stepscope.integrations.hf needs transformers: pip install 'stepscope[hf]'") from exc


class StepscopeCallback(TrainerCallback):  # type: ignore[misc]
    """Profile a `transformers.Trainer` run with stepscope.

    Options are those of `stepscope.performance_monitor` (keyword arguments, or `config=` a ProfileConfig or a
    YAML path, the keywords overriding it).
    """

    def __init__(self, config: ProfileConfig | str | Path | None = None, **options: Any) -> None:
        self._config = config
        self._options = resolve_options(config, options, default_out=None)
        self.monitor: Any = None
        self._headline = Headline()

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if self.monitor is not None:  # a second train() with the same callback: a new run folder
            self.monitor.close()
        options = resolve_options(self._config, self._options, default_out=str(args.output_dir))
        self.monitor = PerformanceMonitor(model, config=self._config, **options)
        if (
            self.monitor.enabled and "deepspeed" in sys.modules
        ):  # the Trainer's DeepSpeed engine, where it has one
            use_engine(self.monitor, engine_of(model))
        self.monitor.add_step_listener(self._headline.on_line)
        _log_before_the_loggers(self)
        # The step that takes global_step from N-1 to N is the one the Trainer logs as step N: ours too.
        self.monitor.start(first_step=int(state.global_step) + 1)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.monitor is None:
            return
        self.monitor.step()
        if self._headline.pending:
            control.should_log = True  # the Trainer logs at the end of this step; on_log adds ours

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if logs is None or not self._headline.pending:
            return
        entry = _history_entry(state, logs)
        headline = self._headline.take()
        logs.update(headline)
        if entry is not None:
            entry.update(headline)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.monitor is not None:
            self.monitor.close()

    @property
    def run_dir(self) -> Path | None:
        """The run folder of the current (or last) training; None before training starts."""
        return self.monitor.run_dir if self.monitor is not None else None


def _history_entry(state: Any, logs: dict[str, Any]) -> dict[str, Any] | None:
    """The entry of `state.log_history` that the Trainer made of `logs`: it appends a copy of them before it
    calls `on_log`, so what a callback adds to `logs` reaches the loggers but not the history (nor the
    trainer_state.json of checkpoints) unless it is added there too."""
    history = getattr(state, "log_history", None)
    if not history or not isinstance(history[-1], dict):
        return None
    entry: dict[str, Any] = history[-1]
    if entry.get("step") != getattr(state, "global_step", None):
        return None
    same = all(key in entry and (entry[key] is value or entry[key] == value) for key, value in logs.items())
    return entry if same else None


def _log_before_the_loggers(callback: Any) -> None:
    """Move `callback` to the front of the Trainer's callback list. The Trainer hands one `logs` dict to every
    callback in turn and the reporting ones (W&B, TensorBoard, ...) come first, so numbers added after them
    would never be logged. Called from inside the handler's loop: moving the current item to the front keeps
    the loop on the same next item."""
    frame: FrameType | None = sys._getframe(1)
    for _ in range(6):
        if frame is None:
            return
        handler = frame.f_locals.get("self")
        callbacks = getattr(handler, "callbacks", None)
        if isinstance(callbacks, list) and any(c is callback for c in callbacks):
            if callbacks[0] is not callback:
                callbacks.remove(callback)
                callbacks.insert(0, callback)
            for other in callbacks[1:]:
                _guard_on_log(other, callback._headline)
            return
        frame = frame.f_back


def _guard_on_log(other: Any, headline: Headline) -> None:
    """Make the `on_log` of a callback that logs after ours survive our numbers: where it raises on a `logs`
    that holds them, they are taken out, it runs again without them, and our logging is off (one warning).
    Logging into the Trainer is best effort; a logger that rejects a key (`stepscope/step_ms`) must not end
    `train()`. Where it raises without our numbers, the error is its own and goes on as it would."""
    on_log = getattr(other, "on_log", None)
    if on_log is None or getattr(on_log, "_stepscope_guard", False):
        return

    def guarded(
        args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> Any:
        try:
            return on_log(args, state, control, logs=logs, **kwargs)
        except Exception as exc:
            ours = [key for key in logs or () if key.startswith(PREFIX)]
            if not ours or logs is None:
                raise
            headline.refused(f"the Trainer callback {type(other).__name__}.on_log", exc)
            for key in ours:
                del logs[key]
            return on_log(args, state, control, logs=logs, **kwargs)

    guarded._stepscope_guard = True  # type: ignore[attr-defined]
    other.on_log = guarded


__all__ = ["StepscopeCallback"]
