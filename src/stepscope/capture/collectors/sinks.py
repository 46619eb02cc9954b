"""Sinks beyond metrics.jsonl (which the monitor always writes): TensorBoard scalars and Weights & Biases.

TensorBoard (`tensorboard=True`): every numeric field of the metrics line of each step a collector worked at
(wall time, TFLOP/s, MFU, memory fields, ...) as a scalar, in `tensorboard/rank{R}/` of the run folder (kind
`tensorboard`). W&B (`wandb=True`): `tflops_rank_{R}` (and `mfu_rank_{R}`) when the FLOP collector has a new
median throughput figure, and for each window `prof/<op>/cpu_time_total` (microseconds, self and children)
of its top 10 host ops by self CPU time, `prof/<kernel>/cuda_time_total` of its top 10 GPU kernels, and
`window_step`, the window's last step (the W&B x-axis of the `prof/` charts). A window's top ops come from the
worker that reads its trace off the training thread: they are logged at the first step the sink sees after
they are known (or at close), so that W&B's step axis only moves forward.
It logs into the run the script already has open (attached to its next step), else into its own run.
Both packages are optional extras, imported here only when asked for; without them the run goes on.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import msgspec

from stepscope.capture.collector import NEVER, Collector, RunContext, Window
from stepscope.capture.console import StepscopeWarning, warn_user
from stepscope.runfolder import ArtifactKind
from stepscope.runfolder.payloads import StepMetrics

TOP_OPS = 10
_SKIP_FIELDS = {"step", "rank"}
_TAG_GROUPS = (
    ("wall_ms", "step"),
    ("monitor_ms", "step"),
    ("tflops", "throughput"),
    ("mfu", "throughput"),
    ("flops", "throughput"),
    ("mem", "memory"),
    ("alloc", "memory"),
    ("reserved", "memory"),
    ("rss", "memory"),
)


def scalar_tag(field: str) -> str:
    """TensorBoard tag of a metrics field: step/wall_ms, step/monitor_ms, throughput/tflops, memory/<field>,
    metrics/<field>."""
    lowered = field.lower()
    for needle, group in _TAG_GROUPS:
        if needle in lowered:
            return f"{group}/{field}"
    return f"metrics/{field}"


def top_op_scalars(top: Any, last_step: int, limit: int = TOP_OPS) -> dict[str, float]:
    """`prof/<op>/cpu_time_total` of the `limit` top host ops of a window (a window_end.TopOps, by self CPU
    time, ProfilerStep spans left out) and `prof/<kernel>/cuda_time_total` of its top kernels (us)."""
    out: dict[str, float] = {"window_step": float(last_step)}
    ops = [o for o in top.ops if not o["name"].startswith("ProfilerStep")]
    for o in ops[:limit]:
        out[f"prof/{o['name'].replace('/', '_')}/cpu_time_total"] = float(o["total_us"])
    for k in top.kernels[:limit]:
        out[f"prof/{k['name'].replace('/', '_')}/cuda_time_total"] = float(k["total_us"])
    return out


def _missing(option: str, package: str) -> None:
    warn_user(
        f"stepscope: {option}=True needs the '{package}' package (pip install 'stepscope[{package}]'); "
        f"{option} logging is off for this run, training goes on",
        StepscopeWarning,
    )


class SinkCollector(Collector):
    """Forwards step metrics to TensorBoard, and throughput and top ops to W&B."""

    name = "sinks"

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.writer: Any = None
        self.tb_dir: Path | None = None
        self.wandb_run: Any = None
        self._own_run = False
        self._closed = False
        self._windows: list[Window] = []  # windows whose top ops are not logged yet
        self._windows_defined = False

    def start(self) -> None:
        cfg = self.ctx.config
        if cfg.tensorboard:
            self._start_tensorboard()
        if cfg.wandb:
            self._start_wandb()

    def _start_tensorboard(self) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            _missing("tensorboard", "tensorboard")
            return
        self.tb_dir = self.ctx.writer.path(ArtifactKind.TENSORBOARD)
        self.tb_dir.mkdir(parents=True, exist_ok=True)
        self.writer = SummaryWriter(log_dir=str(self.tb_dir))

    def _start_wandb(self) -> None:
        try:
            import wandb
        except ImportError:
            _missing("wandb", "wandb")
            return
        if wandb.run is not None:
            self.wandb_run = wandb.run
            return
        ctx = self.ctx
        try:
            self.wandb_run = wandb.init(
                project=os.environ.get("WANDB_PROJECT", "stepscope"),
                name=f"{ctx.run_dir.name}-rank{ctx.rank}",
                group=ctx.run_dir.name,
                dir=os.environ.get("WANDB_DIR") or str(ctx.run_dir),
                config=ctx.config.model_dump(mode="json"),
            )
        except Exception as exc:  # not logged in, no network, ...: keep TensorBoard and the rest going
            warn_user(
                f"stepscope: wandb.init failed ({type(exc).__name__}: {exc}); W&B logging is off for this run "
                "(log in with `wandb login`, or set WANDB_MODE=offline), training goes on",
                StepscopeWarning,
            )
            return
        self._own_run = True

    # --- hooks ------------------------------------------------------------------------------------
    def next_busy(self, step: int) -> int:
        # TensorBoard charts every step's line; W&B needs only the lines other collectors make (throughput),
        # and a line at each step while a window's top ops are on their way (to log them when they come).
        return step if self.writer is not None or self._windows else NEVER

    def on_record(self, line: StepMetrics) -> None:
        if self._closed:
            return
        step = line.step
        if self._windows:
            self._log_windows(step, done_only=True)
        if self.writer is not None:
            for field, value in msgspec.structs.asdict(line).items():
                if field in _SKIP_FIELDS or value is None or isinstance(value, (bool, str)):
                    continue
                self.writer.add_scalar(scalar_tag(field), value, step)
        if line.tflops_median is not None:
            values = {f"tflops_rank_{self.ctx.rank}": line.tflops_median}
            if line.mfu_median is not None:
                values[f"mfu_rank_{self.ctx.rank}"] = line.mfu_median
            self._log_wandb(values, step)

    def on_window(self, window: Window) -> None:
        if not self._closed and self.wandb_run is not None and window.top_ops is not None:
            if not self._windows_defined:
                self._windows_defined = True
                with contextlib.suppress(Exception):  # only the charts' x-axis: the values are logged anyway
                    self.wandb_run.define_metric("prof/*", step_metric="window_step")
            self._windows.append(window)

    def _log_windows(self, step: int, done_only: bool) -> None:
        """Log the top ops of the windows in hand whose worker is done (all of them: the trace collector's
        close waited for its worker)."""
        waiting = []
        for window in self._windows:
            future = window.top_ops
            assert future is not None
            if done_only and not future.done():
                waiting.append(window)
                continue
            top = future.result() if future.done() else None
            if top is not None:
                self._log_wandb(top_op_scalars(top, window.last_step), step)
        self._windows = waiting

    def _log_wandb(self, values: dict[str, float], step: int) -> None:
        if self.wandb_run is None or not values:
            return
        if self._own_run:
            self.wandb_run.log(values, step=step)
        else:  # the script's run has its own step axis: attach to its next step
            self.wandb_run.log(values, commit=False)

    def close(self) -> None:
        if self._closed:
            return
        if self._windows:
            self._log_windows(self.ctx.step, done_only=False)
        self._closed = True
        if self.writer is not None:
            self.writer.close()
            assert self.tb_dir is not None
            for event_file in sorted(self.tb_dir.glob("events.out.tfevents.*")):
                self.ctx.writer.add(ArtifactKind.TENSORBOARD, event_file)
        if self.wandb_run is not None and self._own_run:
            self.wandb_run.finish()
