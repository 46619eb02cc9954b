"""FLOPs of a DeepSpeed engine's job, counted by DeepSpeed's own flops profiler at `flop_counter_step`.

The profiler runs over the whole optimizer step (every micro-batch's forward). Its per-module table (params,
MACs, FLOPs, latency) is kind `ds_flops`; its totals feed the FLOP collector's report (kind `flops`: forward
per module, the backward as `bwd_factor` x the forward, as DeepSpeed's profile counts it), so TFLOP/s and MFU
follow as for any job.
"""

from __future__ import annotations

import time
from typing import Any

from stepscope.capture.collectors.flops import FlopCollector, flop_table, flop_table_text
from stepscope.capture.console import capture_console
from stepscope.runfolder import ArtifactKind
from stepscope.runfolder.payloads import DsFlopsProfile, DsModuleProfile, FlopsReport, ModuleFlops

# DeepSpeed's profile takes the backward as twice the forward (its `bwd_factor`, without recomputation).
BWD_FACTOR = 2.0
ZERO3_LINEAR = (
    "ZeRO-3 runs nn.functional.linear as its own function, which calls torch.addmm; DeepSpeed's flops profiler "
    "counts both, so each Linear's FLOPs and MACs here are about twice its real ones (measured: 1.99x the "
    "forward FLOPs of the same model under ZeRO-2), and so are the FLOPs per step and TFLOP/s"
)
PRECISION_DTYPES = {"bf16": "torch.bfloat16", "fp16": "torch.float16", "fp32": "torch.float32"}


class _Profiling:
    """DeepSpeed's FlopsProfiler started over one step, with a count of the model's forwards."""

    def __init__(self, model: Any, engine: Any) -> None:
        from deepspeed.profiling.flops_profiler.profiler import FlopsProfiler

        self.model = model
        self.profiler = FlopsProfiler(model, ds_engine=engine)
        self.forwards = 0
        self._hook = model.register_forward_pre_hook(self._count)
        self.profiler.start_profile()
        self.started = time.perf_counter()

    def _count(self, *_: Any) -> None:
        self.forwards += 1

    def __exit__(self, *_: Any) -> None:
        self._hook.remove()
        self.profiler.stop_profile()
        self.profiler.end_profile()


class DeepSpeedFlopsCollector(FlopCollector):
    """Counts one optimizer step's FLOPs with DeepSpeed's flops profiler; then TFLOP/s and MFU per step."""

    name = "ds_flops"

    def before_step(self, step: int) -> None:
        if step != self.step:
            return
        self._modes.append(_Profiling(self.ctx.model, self.ctx.engine))

    def _exit_modes(self) -> None:
        (profiling,) = self._modes
        assert self.step is not None
        step_s = time.perf_counter() - profiling.started
        profile = profile_of(profiling, self.ctx.rank, self.step, step_s)  # (read before the profiler ends)
        if _zero_stage(self.ctx.engine) == 3:
            profile.notes.append(ZERO3_LINEAR)
        self._leave_modes()
        self.ctx.writer.write_json(ArtifactKind.DS_FLOPS, profile, self.step)
        self._ds_counted(profile)

    def _ds_counted(self, profile: DsFlopsProfile) -> None:
        from stepscope.capture.collectors.deepspeed import engine_info

        ctx, cfg = self.ctx, self.ctx.config
        precision = engine_info(ctx.engine, ctx.rank, []).precision
        dtype = PRECISION_DTYPES.get(precision)
        self.flops = profile.flops_per_step
        device = self._find_peak(dtype)
        modules = [
            ModuleFlops(
                name=m.name,
                label=f"{m.type} (model)" if m.name == "" else m.name,
                type=m.type,
                depth=m.depth,
                flops=m.flops,
                ops={},
            )
            for m in profile.modules
        ]
        self._report = FlopsReport(
            rank=ctx.rank,
            step=profile.step,
            requested_step=cfg.flop_counter_step,
            total_flops=profile.flops_per_step,
            ops={},
            modules=modules,
            device=device or "cpu",
            matmul_dtype=dtype,
            peak_format=self.format,
            model=type(ctx.model).__name__,
            forward_outside_flops=0,
            backward_flops=profile.flops_per_step - profile.fwd_flops,
            backward_ops={},
        )
        self._report.note = "; ".join(profile.notes) or None
        self._text = (
            f"DeepSpeed's flops profiler: forward FLOPs per module; the backward taken as {profile.bwd_factor:g}x "
            "the forward, as DeepSpeed counts it\n" + flop_table_text(self._report, cfg.flop_table_depth)
        )
        self._write()
        if ctx.is_first_profiled_rank and cfg.console:
            capture_console().print(flop_table(self._report, cfg.flop_table_depth))


def _zero_stage(engine: Any) -> int:
    stage = getattr(engine, "zero_optimization_stage", None)
    return int(stage()) if callable(stage) else 0


def profile_of(profiling: _Profiling, rank: int, step: int, step_s: float) -> DsFlopsProfile:
    """The profiler's figures per module of the model (depth 1: the model), read from what it attached."""
    from deepspeed.profiling.flops_profiler.profiler import (
        get_module_duration,
        get_module_flops,
        get_module_macs,
    )

    model = profiling.model
    rows = []
    for name, module in model.named_modules():
        if not hasattr(module, "__flops__"):
            continue
        rows.append(
            DsModuleProfile(
                name=name,
                type=type(module).__name__,
                depth=1 if name == "" else name.count(".") + 2,
                params=int(getattr(module, "__params__", 0) + getattr(module, "__expert_params__", 0)),
                macs=int(get_module_macs(module)),
                flops=int(get_module_flops(module)),
                latency_s=round(float(get_module_duration(module)), 6),
            )
        )
    top = rows[0] if rows and rows[0].name == "" else None
    fwd_flops = top.flops if top is not None else 0
    return DsFlopsProfile(
        rank=rank,
        step=step,
        micro_steps=profiling.forwards,
        params=top.params if top is not None else 0,
        fwd_macs=top.macs if top is not None else 0,
        fwd_flops=fwd_flops,
        fwd_latency_s=top.latency_s if top is not None else 0.0,
        bwd_factor=BWD_FACTOR,
        flops_per_step=int(fwd_flops * (1 + BWD_FACTOR)),
        step_s=round(step_s, 6),
        modules=rows,
    )
