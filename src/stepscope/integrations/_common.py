"""What the framework callbacks share: the monitor's options, and the headline numbers of each window that
they hand to the framework's own logging (so they reach the W&B / TensorBoard the user configured)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from stepscope.capture.config import ProfileConfig
from stepscope.capture.console import StepscopeWarning, warn_user
from stepscope.capture.engine import is_deepspeed_engine
from stepscope.runfolder.payloads import StepMetrics

PREFIX = "stepscope/"


def resolve_options(
    config: ProfileConfig | str | Path | None, options: dict[str, Any], default_out: str | None
):
    """The callback's options with `out_dir` defaulting to `default_out` (the framework's output folder) when
    neither the keyword arguments nor the config set it. Validates them (ConfigError on a bad option)."""
    merged = dict(options)
    if default_out is not None and "out_dir" not in merged and not _sets_out_dir(config):
        merged["out_dir"] = os.path.join(default_out, "stepscope")
    ProfileConfig.build(config, **merged)  # fail here, with the option's name, not inside training
    return merged


def use_engine(monitor: Any, engine: Any) -> None:
    """Under a framework's DeepSpeed strategy: the monitor records the engine's own figures (settings, flops profile,
    comms logger, memory) while the callback goes on ending the steps. Before the monitor starts."""
    if is_deepspeed_engine(engine):
        monitor.engine = engine


def _sets_out_dir(config: ProfileConfig | str | Path | None) -> bool:
    if config is None:
        return False
    if isinstance(config, ProfileConfig):
        return "out_dir" in config.model_fields_set
    return "out_dir" in ProfileConfig.from_yaml(config).model_fields_set


class Headline:
    """Collects the metrics lines of a window (a step listener) and, once the window's last step is done,
    offers its headline numbers: mean step time of the active steps, and TFLOP/s / MFU when counted."""

    def __init__(self) -> None:
        self.off = False  # the framework's logging refused our numbers once: none are offered again
        self._active_ms: list[float] = []
        self._tflops: float | None = None
        self._mfu: float | None = None
        self._pending: dict[str, float] = {}

    def on_line(self, line: StepMetrics) -> None:
        if line.tflops_median is not None:
            self._tflops = line.tflops_median
        if line.mfu_median is not None:
            self._mfu = line.mfu_median
        if line.phase in ("record", "record_and_save"):
            self._active_ms.append(line.wall_ms)
        if line.phase == "record_and_save" and self._active_ms:
            out = {
                PREFIX + "step_ms": sum(self._active_ms) / len(self._active_ms),
                PREFIX + "window_last_step": float(line.step),
            }
            if self._tflops is not None:
                out[PREFIX + "tflops"] = self._tflops
            if self._mfu is not None:
                out[PREFIX + "mfu"] = self._mfu
            self._pending.update(out)
            self._active_ms = []

    @property
    def pending(self) -> bool:
        return bool(self._pending) and not self.off

    def refused(self, where: str, exc: Exception) -> None:
        """The framework's logging (`where`) raised on our numbers: one warning, and logging into it is off
        (best effort: the numbers are in the run folder all the same)."""
        if self.off:
            return
        self.off = True
        self._pending = {}
        warn_user(
            f"stepscope: {where} failed on stepscope's numbers ({type(exc).__name__}: {exc}); they are no longer "
            "logged there (the run folder has them), training goes on",
            StepscopeWarning,
        )

    def take(self) -> dict[str, float]:
        out, self._pending = self._pending, {}
        return out
