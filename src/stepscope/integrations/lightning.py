"""Lightning (>= 2): `Trainer(callbacks=[StepscopeCallback()])` profiles the training.

A step is an optimizer step (`accumulate_grad_batches` respected; manual optimization too) and carries
`trainer.global_step` as it is while the step runs (0, 1, ..., the step `self.log` in `training_step` reports),
also when training resumes from a checkpoint. Under DDP every process runs the callback; the monitor decides
which ranks record (`profiled_ranks`) and all ranks share one run folder. The run folder goes under
`trainer.default_root_dir/stepscope` unless `out_dir` is given. After each window the headline numbers
(`stepscope/step_ms`, and `stepscope/tflops` / `stepscope/mfu` when FLOPs are counted) go to the trainer's
loggers (`log_metrics`, which Lightning runs on global rank 0).

Needs `lightning` (pip install 'stepscope[lightning]'); importing this module without it says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stepscope.capture.config import ProfileConfig
from stepscope.capture.monitor import PerformanceMonitor
from stepscope.integrations._common import Headline, resolve_options, use_engine

try:
    from lightning.pytorch.callbacks import Callback
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "stepscope.integrations.lightning needs lightning >= 2: pip install 'stepscope[lightning]'"
    ) from exc


class StepscopeCallback(Callback):  # type: ignore[misc]
    """Profile a Lightning `Trainer.fit` with stepscope.

    Options are those of `stepscope.performance_monitor` (keyword arguments, or `config=` a ProfileConfig or a
    YAML path, the keywords overriding it).
    """

    def __init__(self, config: ProfileConfig | str | Path | None = None, **options: Any) -> None:
        super().__init__()
        self._config = config
        self._options = resolve_options(config, options, default_out=None)
        self.monitor: Any = None
        self._headline = Headline()
        self._global_step = 0

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self.monitor is not None:  # a second fit() with the same callback: a new run folder
            self.monitor.close()
        options = resolve_options(self._config, self._options, default_out=str(trainer.default_root_dir))
        self.monitor = PerformanceMonitor(pl_module, config=self._config, **options)
        # DeepSpeedStrategy: its engine's own figures too (the strategy runs on CUDA only)
        use_engine(self.monitor, getattr(trainer.strategy, "deepspeed_engine", None))
        self.monitor.add_step_listener(self._headline.on_line)
        self._global_step = int(trainer.global_step)
        self.monitor.start(first_step=self._global_step)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.monitor is None:
            return
        global_step = int(trainer.global_step)
        if global_step == self._global_step:  # an accumulation micro-batch: the step goes on
            return
        self._global_step = global_step
        self.monitor.step()
        if self._headline.pending:
            metrics = self._headline.take()
            for logger in trainer.loggers:
                try:
                    logger.log_metrics(metrics, step=global_step - 1)
                except Exception as exc:
                    self._headline.refused(f"the logger {type(logger).__name__}.log_metrics", exc)
                    return

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.monitor is not None:
            self.monitor.close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self.monitor is not None:
            self.monitor.close()

    @property
    def run_dir(self) -> Path | None:
        """The run folder of the current (or last) fit; None before training starts."""
        return self.monitor.run_dir if self.monitor is not None else None


__all__ = ["StepscopeCallback"]
