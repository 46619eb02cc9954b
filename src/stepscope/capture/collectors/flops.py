"""The FLOP collector: counts one step's FLOPs with FlopCounterMode, then reports TFLOP/s and MFU.

The counted step (`flop_counter_step`) lies outside every warmup/active window (see `_instrument.place_step`).
Its FLOPs (forward per module, backward as one figure: see `flop_split`) go to a FlopsReport (kind `flops`) and a
table (kind `flops_table`). Throughput divides them by the median wall time of the undisturbed steps (see
`FlopCollector.undisturbed`), once there are enough of them.
"""

from __future__ import annotations

import io
from collections import Counter
from typing import Any

from rich.text import Text

from stepscope.capture.collector import Collector, RunContext
from stepscope.capture.collectors import mfu
from stepscope.capture.collectors._instrument import (
    GLOBAL,
    announce_placement,
    planned_steps,
    quiet_module_tracker,
)
from stepscope.capture.collectors.flop_split import FlopSplit, ModuleBook, split_mode
from stepscope.capture.console import StepscopeWarning, capture_console, warn_user
from stepscope.devices import Peak, lookup_peak, name_by_properties, no_peak_reason
from stepscope.report.terminal import make_console, make_table
from stepscope.runfolder import ArtifactKind
from stepscope.runfolder.payloads import (
    FLOPS_BACKWARD,
    FLOPS_OUTSIDE_MODEL,
    FLOPS_OUTSIDE_MODULES,
    FlopsReport,
    PeakInfo,
    ThroughputInfo,
)
from stepscope.units import fmt_flops

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


def flop_counter(**options: Any) -> Any:
    """torch's FlopCounterMode, with the backward of a grouped convolution counted as it runs: torch 2.13's
    formula multiplies its weight gradient by the groups (a depthwise convolution's backward, 8.5x over with 16
    channels; measured in tests/capture/test_flops.py)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    return FlopCounterMode(
        display=False, custom_mapping={torch.ops.aten.convolution_backward: _conv_backward_flops}, **options
    )


def _conv_backward_flops(
    grad_out_shape: Any, x_shape: Any, w_shape: Any, *args: Any, out_shape: Any = None, **kwargs: Any
) -> int:
    """Each gradient the output mask asks for (the input's, the weight's) costs one forward's FLOPs: every
    product of the forward appears once in each, whatever the groups."""
    from torch.utils.flop_counter import conv_flop_count

    transposed, output_mask = args[4], args[7]
    one = conv_flop_count(list(x_shape), list(w_shape), list(grad_out_shape), transposed=transposed)
    return int(one * (bool(output_mask[0]) + bool(output_mask[1])))


class FlopCollector(Collector):
    """Counts FLOPs at one step; afterwards logs `tflops` (and `mfu`) on every undisturbed step."""

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
        self._book: ModuleBook | None = None
        self._instrumented: set[int] = set()
        self._report: FlopsReport | None = None
        self._text = ""
        self._printed_steps = 0

    # --- hooks ------------------------------------------------------------------------------------
    def start(self) -> None:
        cfg = self.ctx.config
        self.step, comm_step = planned_steps(self.ctx.schedule, cfg.flop_counter_step, cfg.comm_logger_step)
        announce_placement(self.ctx, "flop_counter_step", cfg.flop_counter_step, self.step, "FLOP counting")
        # the first step does one-off start-up work; the counted and comm-logged steps run under a dispatch mode
        self._instrumented = {s for s in (self.ctx.step, self.step, comm_step) if s is not None}

    def undisturbed(self, step: int) -> bool:
        """Whether `step` times the job as it runs: neither it nor the step before it is the first step, a
        traced step or an instrumented one. The step after a window or an instrumented step pays for what they
        left (measured on the CPU: ~2x the steady step after a window); the second step still warms up."""
        schedule = self.ctx.schedule
        return all(s not in self._instrumented and not schedule.is_traced(s) for s in (step, step - 1))

    def before_step(self, step: int) -> None:
        if step != self.step:
            return
        quiet_module_tracker()
        counter = flop_counter(depth=None)
        self._book = ModuleBook.of(self.ctx.model)
        # entered in this order, left in reverse: the split sees each op first and reads what the counter added
        for mode in (counter, dtype_tally(), split_mode(counter, self._book)):
            mode.__enter__()
            self._modes.append(mode)

    def after_step(self, step: int, wall_ms: float) -> dict[str, Any] | None:
        fields: dict[str, Any] = {}
        if self._modes and step == self.step:
            self._exit_modes()
            fields["flops"] = self.flops
        elif self.undisturbed(step):
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
            self._leave_modes()
            warn_user(
                f"stepscope: step {step} raised {type(exc).__name__}; its FLOPs are not counted",
                StepscopeWarning,
            )

    def close(self) -> None:
        if self._modes:  # the job stopped inside the counted step
            self._leave_modes()
        if self.flops is None:
            if self.step is not None and self.ctx.step <= self.step:
                warn_user(
                    f"stepscope: the job ended before step {self.step}, where FLOPs were to be counted",
                    StepscopeWarning,
                )
            return
        if not self.flops:
            return
        if self.result is None:
            self._too_few_steps()
        elif len(self.times) > self.result.steps_timed:
            self._report_throughput(self.ctx.step - 1, final=True)

    # --- counting ---------------------------------------------------------------------------------
    def _leave_modes(self) -> list[Any]:
        modes, self._modes = self._modes, []
        for mode in reversed(modes):
            mode.__exit__(None, None, None)
        return modes

    def _exit_modes(self) -> None:
        counter, tally, split = self._leave_modes()
        assert self.step is not None and self._book is not None
        self._counted(self.step, counter, tally.main_dtype(), split.split)

    def _counted(self, step: int, counter: Any, dtype: str | None, split: FlopSplit) -> None:
        ctx, cfg = self.ctx, self.ctx.config
        self.flops = int(counter.get_total_flops())
        global_ops = counter.get_flop_counts().get(GLOBAL, {})
        device = self._find_peak(dtype)
        assert self._book is not None
        modules = split.module_rows(self._book)
        backward = sum(split.backward.values())
        in_modules = sum(r.flops for r in modules if r.depth == 1)
        self._report = FlopsReport(
            rank=ctx.rank,
            step=step,
            requested_step=cfg.flop_counter_step,
            total_flops=self.flops,
            ops={str(op): int(n) for op, n in global_ops.items()},
            modules=modules,
            device=device or "cpu",
            matmul_dtype=dtype,
            peak_format=self.format,
            note=ZERO_FLOPS.format(step=step) if self.flops == 0 else None,
            model=self._book.model_type,
            # what the split did not see (none so far) counts as outside: the rows add up to the total
            forward_outside_flops=self.flops - backward - in_modules,
            backward_flops=backward,
            backward_ops=dict(sorted(split.backward.items(), key=lambda kv: (-kv[1], kv[0]))),
        )
        self._text = flop_table_text(self._report, cfg.flop_table_depth)
        self._write()
        if ctx.is_first_profiled_rank and cfg.console:
            console = capture_console()
            console.print(flop_table(self._report, cfg.flop_table_depth))
            if self.flops == 0:
                console.print(self._report.note, markup=False, highlight=False)
        if self.flops == 0:
            warn_user(f"stepscope: {self._report.note}", StepscopeWarning)

    def _find_peak(self, dtype: str | None) -> str | None:
        """Set the peak format and the peak (or why there is none) for matmuls in `dtype`; the device's name."""
        import torch

        cfg = self.ctx.config
        tf32 = torch.backends.cuda.matmul.allow_tf32 or torch.get_float32_matmul_precision() != "highest"
        self.format = peak_format(dtype, tf32) if cfg.peak_dtype == "auto" else cfg.peak_dtype
        device = device_name(self.ctx.model)
        if cfg.peak_tflops is not None:
            self.peak = mfu.override_peak(cfg.peak_tflops, device or "cpu", self.format)
        elif device is not None and self.format is not None:
            self.peak = lookup_peak(device, self.format)
        if self.peak is None:
            self.no_mfu_reason = no_peak_reason(device, self.format)
        return device

    def _too_few_steps(self) -> None:
        """At close without a figure: say why, in the FLOP report and on the console."""
        assert self._report is not None
        self._report.no_throughput_reason = mfu.too_few_steps(len(self.times))
        self._write()
        if self.ctx.is_first_profiled_rank and self.ctx.config.console:
            capture_console().print(
                f"stepscope: rank {self.ctx.rank} (final): {self._report.no_throughput_reason}",
                markup=False,
                highlight=False,
            )

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
            if self._printed_steps:  # the reason for no MFU was printed with the first figure
                lines = [line for line in lines if line != result.no_mfu_reason]
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
        elif report.no_throughput_reason:
            text += "\n" + report.no_throughput_reason + "\n"
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
        q1_step_s=result.q1_step_s,
        q3_step_s=result.q3_step_s,
        spread_note=result.spread_note,
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
    index = index if index is not None else torch.cuda.current_device()
    name = str(torch.cuda.get_device_name(index))
    try:  # ROCm 6 names an MI250 "AMD Radeon Graphics": its properties tell it apart (devices.name_by_properties)
        props = torch.cuda.get_device_properties(index)
        known = {
            "warpSize": getattr(props, "warp_size", None),
            "computeMajor": getattr(props, "major", None),
            "computeMinor": getattr(props, "minor", None),
            "numSms": getattr(props, "multi_processor_count", None),
        }
    except Exception:  # (the name alone then)
        return name
    return name_by_properties(name, known)


def flop_table(report: FlopsReport, depth: int) -> FlopTable:
    """The FLOP table down to `depth`: forward FLOPs per module, then the forward outside the model and the
    backward, one row each; the rows at depth 1 and these two add up to the total."""
    total = report.total_flops or 1
    rows = [
        [row.label, row.type or "", _op_split(row.ops), f"{row.flops:,}", f"{100 * row.flops / total:.1f}%"]
        for row in report.modules
        if row.depth <= depth
    ]
    outside = report.forward_outside_flops
    if outside > 0:
        label = FLOPS_OUTSIDE_MODEL if report.model is not None else FLOPS_OUTSIDE_MODULES
        rows.append([label, "", "", f"{outside:,}", f"{100 * outside / total:.1f}%"])
    if report.backward_flops:
        backward = report.backward_flops
        split = _op_split(report.backward_ops)
        rows.append([FLOPS_BACKWARD, "", split, f"{backward:,}", f"{100 * backward / total:.1f}%"])
    title = (
        f"stepscope: FLOPs of step {report.step}, rank {report.rank}: {report.total_flops:,} "
        f"({fmt_flops(report.total_flops)}), forward + backward; per module the forward, the backward in one row"
    )
    return FlopTable(title, rows)


class FlopTable:
    """The FLOP table (rich): module, type, ops, FLOPs, % total. Where the console is too narrow for all of it,
    the ops column is left out (the text file and the JSON keep it) and the names are shortened, each with an
    ellipsis (FitTable)."""

    COLUMNS = ("module", "type", "ops", "FLOPs", "% total")
    OPS = 2

    def __init__(self, title: str, rows: list[list[str]]) -> None:
        self.title = title
        self.rows = rows

    def __rich_console__(self, console: Any, options: Any) -> Any:
        columns, rows = list(self.COLUMNS), self.rows
        natural = sum(max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(columns))
        if natural + 3 * (len(columns) - 1) > options.max_width:
            columns.pop(self.OPS)
            rows = [r[: self.OPS] + r[self.OPS + 1 :] for r in rows]
        # (a line of its own: a table's title would wrap at the table's width)
        yield Text(self.title)
        # the text columns come first: FitTable shortens those, never the numbers
        yield make_table(None, columns, rows, numeric_from=columns.index("FLOPs"))


def _op_split(ops: dict[str, int]) -> str:
    flops = sum(ops.values())
    return ", ".join(f"{op.removeprefix('aten.')} {100 * n / max(flops, 1):.0f}%" for op, n in ops.items())


def flop_table_text(report: FlopsReport, depth: int) -> str:
    buffer = io.StringIO()
    make_console(file=buffer, width=160).print(flop_table(report, depth))
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
