"""Sinks beyond metrics.jsonl (which the monitor always writes): TensorBoard scalars and Weights & Biases.

TensorBoard (`tensorboard=True`): every numeric field of the metrics line of each step a collector worked at
(wall time, TFLOP/s, MFU, memory fields, ...) as a scalar, in `tensorboard/rank{R}/` of the run folder (kind
`tensorboard`). W&B (`wandb=True`): `tflops_rank_{R}` (and `mfu_rank_{R}`) when the FLOP collector has a new
median throughput figure, and `prof/<op>/cuda_time_total` / `prof/<op>/cpu_time_total` (microseconds) for the
top 10 ops of each window.
It logs into the run the script already has open (attached to its next step), else into its own run.
Both packages are optional extras, imported here only when asked for; without them the run goes on.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgspec

from stepscope.capture.collector import NEVER, Collector, RunContext, StepscopeWarning, Window, warn_user
from stepscope.runfolder import ArtifactKind
from stepscope.runfolder.payloads import StepMetrics

TOP_OPS = 10
_SKIP_FIELDS = {"step", "rank"}
_TAG_GROUPS = (
    ("wall_ms", "step"),
    ("tflops", "throughput"),
    ("mfu", "throughput"),
    ("flops", "throughput"),
    ("mem", "memory"),
    ("alloc", "memory"),
    ("reserved", "memory"),
    ("rss", "memory"),
)


def scalar_tag(field: str) -> str:
    """TensorBoard tag of a metrics field: step/wall_ms, throughput/tflops, memory/<field>, metrics/<field>."""
    lowered = field.lower()
    for needle, group in _TAG_GROUPS:
        if needle in lowered:
            return f"{group}/{field}"
    return f"metrics/{field}"


def top_op_scalars(averages: Any, sort_key: str, limit: int = TOP_OPS) -> dict[str, float]:
    """`prof/<op>/cuda_time_total` and `prof/<op>/cpu_time_total` (us) of the `limit` top ops of a window."""
    ops = [e for e in averages if not e.key.startswith("ProfilerStep")]
    ops.sort(key=lambda e: getattr(e, sort_key, 0), reverse=True)
    out: dict[str, float] = {}
    for e in ops[:limit]:
        name = e.key.replace("/", "_")
        out[f"prof/{name}/cuda_time_total"] = float(getattr(e, "device_time_total", 0.0) or 0.0)
        out[f"prof/{name}/cpu_time_total"] = float(e.cpu_time_total)
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
        # TensorBoard charts every step's line; W&B needs only the lines other collectors make (throughput).
        return step if self.writer is not None else NEVER

    def on_record(self, line: StepMetrics) -> None:
        if self._closed:
            return
        step = line.step
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
        if not self._closed and self.wandb_run is not None and window.averages is not None:
            self._log_wandb(top_op_scalars(window.averages, window.sort_key), window.last_step)

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
        self._closed = True
        if self.writer is not None:
            self.writer.close()
            assert self.tb_dir is not None
            for event_file in sorted(self.tb_dir.glob("events.out.tfevents.*")):
                self.ctx.writer.add(ArtifactKind.TENSORBOARD, event_file)
        if self.wandb_run is not None and self._own_run:
            self.wandb_run.finish()
