"""The FLOP collector: counts one step's FLOPs with FlopCounterMode, then reports TFLOP/s and MFU.

The counted step (`flop_counter_step`) lies outside every warmup/active window (see `_instrument.place_step`).
Its FLOPs (forward + backward, per module) go to a FlopsReport (kind `flops`) and a table (kind `flops_table`). Throughput divides
them by the median wall time of the uninstrumented steps: neither traced, nor counted, nor comm-logged, nor
the first step (one-off start-up work).
"""

from __future__ import annotations

import io
from collections import Counter
from typing import Any

from stepscope.capture import mfu
from stepscope.capture._instrument import (
    GLOBAL,
    ModuleNames,
    announce_placement,
    planned_steps,
    quiet_module_tracker,
)
from stepscope.capture.collector import Collector, RunContext, StepscopeWarning, capture_console, warn_user
from stepscope.capture.peaks import Peak, lookup_peak, no_peak_reason
from stepscope.report.terminal import make_console, make_table
from stepscope.runfolder import ArtifactKind
from stepscope.runfolder.payloads import FlopsReport, ModuleFlops, PeakInfo, ThroughputInfo

ZERO_FLOPS = (
    "FlopCounterMode counted 0 FLOPs at step {step}: no matmul, convolution or attention op ran through the "
    "dispatcher (a transformer layer in eval()/no_grad takes a fused fast path that it cannot see); count a "
    "training step instead. No TFLOP/s is reported."
)


def peak_format(dtype: str | None, tf32: bool) -> str | None:
    """Peak-table number format for a torch dtype name ('torch.bfloat16' -> 'bf16')."""
    if dtype is None:
        return None
    name = dtype.removeprefix("torch.")
    if name == "float32":
        return "tf32" if tf32 else "fp32"
    if name in ("bfloat16", "float16"):
        return {"bfloat16": "bf16", "float16": "fp16"}[name]
    if name.startswith("float8"):
        return "fp8"
    return None


class FlopCollector(Collector):
    """Counts FLOPs at one step; afterwards logs `tflops` (and `mfu`) on every timed step."""

    name = "flops"

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.step: int | None = None
        self.flops: int | None = None
        self.times: list[float] = []
        self.peak: Peak | None = None
        self.no_mfu_reason: str | None = None
        self.format: str | None = None
        self.result: mfu.Throughput | None = None
        self._modes: list[Any] = []
        self._excluded: set[int] = set()
        self._report: FlopsReport | None = None
        self._text = ""
        self._printed_steps = 0

    # --- hooks ------------------------------------------------------------------------------------
    def start(self) -> None:
        cfg = self.ctx.config
        self.step, comm_step = planned_steps(self.ctx.schedule, cfg.flop_counter_step, cfg.comm_logger_step)
        announce_placement(self.ctx, "flop_counter_step", cfg.flop_counter_step, self.step, "FLOP counting")
        self._excluded = {s for s in (0, self.step, comm_step) if s is not None}

    def before_step(self, step: int) -> None:
        if step != self.step:
            return
        from torch.utils.flop_counter import FlopCounterMode

        quiet_module_tracker()
        counter = FlopCounterMode(display=False, depth=None)  # type: ignore[arg-type]
        tally = dtype_tally()
        counter.__enter__()
        self._modes = [counter]
        tally.__enter__()
        self._modes.append(tally)

    def after_step(self, step: int, wall_ms: float) -> dict[str, Any] | None:
        fields: dict[str, Any] = {}
        if self._modes and step == self.step:
            counter, tally = self._exit_modes()
            self._counted(step, counter, tally)
            fields["flops"] = self.flops
        elif step not in self._excluded and not self.ctx.schedule.is_traced(step):
            seconds = wall_ms / 1e3
            self.times.append(seconds)
            if self.flops and seconds > 0:
                tflops = mfu.achieved_tflops(self.flops, seconds)
                fields["tflops"] = tflops
                if self.peak is not None:
                    fields["mfu"] = mfu.mfu(tflops, self.peak.tflops)
        if self.flops and self.result is None and len(self.times) >= mfu.MIN_TIMED_STEPS:
            result = self._report_throughput(step)
            if result is not None:
                fields["tflops_median"] = result.tflops
                if result.mfu is not None:
                    fields["mfu_median"] = result.mfu
        return fields

    def step_failed(self, step: int, exc: BaseException) -> None:
        if self._modes:
            self._exit_modes()
            warn_user(
                f"stepscope: step {step} raised {type(exc).__name__}; its FLOPs are not counted",
                StepscopeWarning,
            )

    def close(self) -> None:
        if self._modes:  # the job stopped inside the counted step
            self._exit_modes()
        if self.flops is None:
            if self.step is not None and self.ctx.step <= self.step:
                warn_user(
                    f"stepscope: the job ended before step {self.step}, where FLOPs were to be counted",
                    StepscopeWarning,
                )
            return
        if self.flops and self.times and (self.result is None or len(self.times) > self.result.steps_timed):
            self._report_throughput(self.ctx.step - 1, final=True)

    # --- counting ---------------------------------------------------------------------------------
    def _exit_modes(self) -> tuple[Any, Any]:
        modes, self._modes = self._modes, []
        for mode in reversed(modes):
            mode.__exit__(None, None, None)
        return modes[0], modes[1] if len(modes) > 1 else None

    def _counted(self, step: int, counter: Any, tally: Any) -> None:
        import torch

        ctx, cfg = self.ctx, self.ctx.config
        self.flops = int(counter.get_total_flops())
        counts = {
            name: {str(op): int(n) for op, n in ops.items()}
            for name, ops in counter.get_flop_counts().items()
        }
        names = ModuleNames.build(counts, ctx.model)
        dtype = tally.main_dtype() if tally is not None else None
        tf32 = torch.backends.cuda.matmul.allow_tf32 or torch.get_float32_matmul_precision() != "highest"
        self.format = peak_format(dtype, tf32) if cfg.peak_dtype == "auto" else cfg.peak_dtype
        device = device_name(ctx.model)
        if cfg.peak_tflops is not None:
            self.peak = mfu.override_peak(cfg.peak_tflops, device or "cpu", self.format)
        elif device is not None and self.format is not None:
            self.peak = lookup_peak(device, self.format)
        if self.peak is None:
            self.no_mfu_reason = no_peak_reason(device, self.format)
        self._report = FlopsReport(
            rank=ctx.rank,
            step=step,
            requested_step=cfg.flop_counter_step,
            total_flops=self.flops,
            ops=counts.get(GLOBAL, {}),
            modules=module_rows(counts, names),
            device=device or "cpu",
            matmul_dtype=dtype,
            peak_format=self.format,
            note=ZERO_FLOPS.format(step=step) if self.flops == 0 else None,
        )
        self._text = flop_table_text(self._report, cfg.flop_table_depth, names.root is not None)
        self._write()
        if ctx.is_first_profiled_rank and cfg.console:
            console = capture_console()
            console.print(flop_table(self._report, cfg.flop_table_depth, names.root is not None))
            if self.flops == 0:
                console.print(self._report.note, markup=False, highlight=False)
        if self.flops == 0:
            warn_user(f"stepscope: {self._report.note}", StepscopeWarning)

    def _report_throughput(self, step: int, final: bool = False) -> mfu.Throughput | None:
        assert self.flops is not None and self._report is not None
        result = mfu.throughput(self.flops, self.times, self.peak, self.no_mfu_reason)
        if result is None:
            return None
        self.result = result
        self._report.throughput = throughput_info(result)
        self._write()
        if (
            self.ctx.is_first_profiled_rank
            and self.ctx.config.console
            and result.steps_timed > self._printed_steps
        ):
            prefix = f"stepscope: rank {self.ctx.rank}{' (final)' if final else ''}: "
            lines = result.lines()
            if self._printed_steps and result.mfu is None:
                lines = lines[:1]  # the reason for no MFU was printed with the first figure
            self._printed_steps = result.steps_timed
            for line in lines:
                capture_console().print(prefix + line, markup=False, highlight=False)
        return result

    def _write(self) -> None:
        report, writer = self._report, self.ctx.writer
        assert report is not None
        text = self._text
        if report.note:
            text += "\n" + report.note + "\n"
        if self.result is not None:
            text += "\n" + "\n".join(self.result.lines()) + "\n"
        writer.write_text(ArtifactKind.FLOPS_TABLE, text, report.step)
        writer.write_json(ArtifactKind.FLOPS, report, report.step)


def throughput_info(result: mfu.Throughput) -> ThroughputInfo:
    peak = result.peak
    return ThroughputInfo(
        flops=result.flops,
        median_step_s=result.median_step_s,
        steps_timed=result.steps_timed,
        tflops=result.tflops,
        mfu=result.mfu,
        peak=PeakInfo(peak.tflops, peak.device, peak.dtype, peak.source) if peak is not None else None,
        no_mfu_reason=result.no_mfu_reason,
        formula=mfu.FORMULA,
    )


def device_name(model: Any) -> str | None:
    """CUDA/ROCm device name of the model's parameters (or the current device); None on the CPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    index = None
    if model is not None and hasattr(model, "parameters"):
        param = next(iter(model.parameters()), None)
        if param is not None:
            if param.device.type != "cuda":
                return None
            index = param.device.index
    return str(torch.cuda.get_device_name(index if index is not None else torch.cuda.current_device()))


def module_rows(counts: dict[str, dict[str, int]], names: ModuleNames) -> list[ModuleFlops]:
    """One row per module that did FLOPs, in the model's order, with model-relative names."""
    rows = []
    for tracker_name, ops in counts.items():
        if tracker_name == GLOBAL:
            continue
        relative = names.relative(tracker_name)
        if relative is None:
            continue
        rows.append(
            ModuleFlops(
                name=relative,
                label=names.label(relative),
                type=names.types.get(relative),
                depth=names.depth(relative),
                flops=sum(ops.values()),
                ops=dict(sorted(ops.items(), key=lambda kv: -kv[1])),
            )
        )
    rows.sort(key=lambda r: names.sort_key(r.name))
    return rows


def flop_table(report: FlopsReport, depth: int, has_model: bool) -> Any:
    """The per-module FLOP table (rich) down to `depth`."""
    total = report.total_flops or 1
    rows = []
    for row in report.modules:
        if row.depth > depth:
            continue
        indent = "  " * (row.depth - 1)
        ops = ", ".join(
            f"{op.removeprefix('aten.')} {100 * n / max(row.flops, 1):.0f}%" for op, n in row.ops.items()
        )
        rows.append(
            [indent + row.label, row.type or "", f"{row.flops:,}", f"{100 * row.flops / total:.1f}%", ops]
        )
    if has_model:
        model_flops = next((r.flops for r in report.modules if r.name == ""), 0)
        outside = report.total_flops - model_flops
        if outside > 0:
            rows.append(["(outside the model)", "", f"{outside:,}", f"{100 * outside / total:.1f}%", ""])
    title = (
        f"stepscope: FLOPs of step {report.step}, rank {report.rank} (forward + backward): "
        f"{report.total_flops:,} ({report.total_flops / 1e9:.4g} GFLOP)"
    )
    return make_table(title, ["module", "type", "FLOPs", "% total", "ops"], rows, numeric_from=2)


def flop_table_text(report: FlopsReport, depth: int, has_model: bool) -> str:
    buffer = io.StringIO()
    make_console(file=buffer, width=160).print(flop_table(report, depth, has_model))
    return buffer.getvalue()


def dtype_tally() -> Any:
    """A dispatch mode that weighs the input dtypes of matmul-like ops by their output size."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    aten = torch.ops.aten
    names = (
        "mm", "addmm", "bmm", "baddbmm", "convolution", "_scaled_mm", "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
        "_flash_attention_forward", "_efficient_attention_forward",
    )  # fmt: skip
    watched = {getattr(aten, n) for n in names if hasattr(aten, n)}

    class DtypeTally(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.weights: Counter[str] = Counter()

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            if func.overloadpacket in watched:
                first = next((a for a in args if isinstance(a, torch.Tensor)), None)
                if first is not None:
                    size = out.numel() if isinstance(out, torch.Tensor) else 1
                    self.weights[str(first.dtype)] += max(size, 1)
            return out

        def main_dtype(self) -> str | None:
            return self.weights.most_common(1)[0][0] if self.weights else None

    return DtypeTally()
