"""The DeepSpeed engine's collector: the engine's configuration (kind `deepspeed`) at the start, and DeepSpeed's
comms logger switched on over each window's active steps, its per-op summary (kind `ds_comms`) written at the
window's end. `ds_memory` reads what DeepSpeed's `see_memory_usage` prints, for the memory log.

deepspeed is imported only here, once a monitor was given an engine (the job imported deepspeed already).
"""

from __future__ import annotations

from statistics import fmean
from typing import Any

from stepscope.capture.collector import NEVER, Collector, RunContext
from stepscope.capture.console import StepscopeWarning, warn_user
from stepscope.runfolder import ArtifactKind
from stepscope.runfolder.payloads import DeepSpeedEngineInfo, DsCommOp, DsCommsSummary

LOGGER_IN_USE = (
    "DeepSpeed's comms logger is already on in this job's configuration (comms_logger.enabled): stepscope leaves "
    "it as it is and records no comms summary of its own"
)


class DeepSpeedCollector(Collector):
    """Records a DeepSpeed engine's configuration, and DeepSpeed's comms logger over each window."""

    name = "deepspeed"

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.engine = ctx.engine
        self._logger: Any = None  # DeepSpeed's CommsLogger, while stepscope owns it
        self._first: int | None = None  # first active step of the window being logged
        self._notes: list[str] = []

    def start(self) -> None:
        from deepspeed.comm import comm

        logger = comm.comms_logger
        if logger.enabled:
            self._notes.append(LOGGER_IN_USE)
            warn_user(f"stepscope: {LOGGER_IN_USE}", StepscopeWarning)
        else:
            self._logger = logger
        self.ctx.writer.write_json(
            ArtifactKind.DEEPSPEED, engine_info(self.engine, self.ctx.rank, self._notes)
        )

    def next_busy(self, step: int) -> int:
        if self._logger is None:
            return NEVER
        if self._first is not None:
            return step
        return self.ctx.schedule.next_traced_step(step)

    def before_step(self, step: int) -> None:
        logger = self._logger
        if logger is None or self._first is not None or not self.ctx.schedule.is_active(step):
            return
        logger.comms_dict.clear()  # (reset_data() is recent; comms_dict is in every version)
        logger.prof_all = True
        logger.verbose = False
        logger.enabled = True
        self._first = step

    def after_step(self, step: int, wall_ms: float) -> dict[str, Any] | None:
        if self._first is not None and self.ctx.schedule.window_end(step) == step:
            self._harvest(step)
        return None

    def step_failed(self, step: int, exc: BaseException) -> None:
        if self._first is not None:
            self._harvest(step)

    def close(self) -> None:
        if self._first is not None:  # the job ended inside a window
            self._harvest(self.ctx.step - 1)

    def _harvest(self, last: int) -> None:
        logger, first = self._logger, self._first
        assert logger is not None and first is not None
        logger.enabled = False
        self._first = None
        ops = comm_ops(logger.comms_dict)
        logger.comms_dict.clear()
        summary = DsCommsSummary(rank=self.ctx.rank, first_step=first, last_step=last, ops=ops)
        self.ctx.writer.write_json(ArtifactKind.DS_COMMS, summary, last)


def comm_ops(comms_dict: dict[str, dict[int, list[Any]]]) -> list[DsCommOp]:
    """DeepSpeed's comms_dict ({op: {message bytes: [count, latencies ms, algbws, busbws]}}) as rows, by total
    latency, largest first."""
    rows = []
    for op, sizes in comms_dict.items():
        for size, (count, latencies, algbws, busbws) in sizes.items():
            total = float(sum(latencies))
            rows.append(
                DsCommOp(
                    op=str(op),
                    msg_bytes=int(size),
                    count=int(count),
                    total_latency_ms=round(total, 4),
                    mean_latency_ms=round(total / max(int(count), 1), 4),
                    algbw_gbps=round(fmean(algbws), 6) if algbws else 0.0,
                    busbw_gbps=round(fmean(busbws), 6) if busbws else 0.0,
                )
            )
    return sorted(rows, key=lambda r: (-r.total_latency_ms, r.op, r.msg_bytes))


def _offload_device(section: Any) -> str | None:
    device = getattr(section, "device", None)
    if device is None:
        return None
    name = str(getattr(device, "value", device))
    return None if name in ("none", "None", "") else name


def _call(engine: Any, method: str) -> Any:
    fn = getattr(engine, method, None)
    try:
        return fn() if callable(fn) else None
    except Exception:
        return None


def engine_info(engine: Any, rank: int, notes: list[str]) -> DeepSpeedEngineInfo:
    """What the engine says of its configuration: ZeRO stage, offload, parallel sizes, batch, precision."""
    import deepspeed

    config = getattr(engine, "_config", None)
    zero = getattr(config, "zero_config", None)
    stage = _call(engine, "zero_optimization_stage")
    precision = (
        "bf16" if _call(engine, "bfloat16_enabled") else "fp16" if _call(engine, "fp16_enabled") else "fp32"
    )
    optimizer = getattr(engine, "optimizer", None)
    inner = getattr(optimizer, "optimizer", None)  # a ZeRO optimizer wraps the user's
    world = getattr(engine, "world_size", None)
    return DeepSpeedEngineInfo(
        rank=rank,
        deepspeed_version=str(deepspeed.__version__),
        engine=type(engine).__name__,
        zero_stage=int(stage or 0),
        offload_optimizer=_offload_device(getattr(zero, "offload_optimizer", None)),
        offload_param=_offload_device(getattr(zero, "offload_param", None)),
        world_size=int(world) if world is not None else 1,
        dp_size=getattr(engine, "dp_world_size", None),
        mp_size=getattr(engine, "mp_world_size", None),
        pp_size=_pipeline_size(engine),
        micro_batch=_call(engine, "train_micro_batch_size_per_gpu"),
        gradient_accumulation=_call(engine, "gradient_accumulation_steps"),
        train_batch=_call(engine, "train_batch_size"),
        precision=precision,
        optimizer=type(inner or optimizer).__name__ if optimizer is not None else None,
        notes=list(notes),
    )


def _pipeline_size(engine: Any) -> int | None:
    grid = getattr(engine, "grid", None)  # a PipelineEngine's topology grid
    if grid is not None and hasattr(grid, "get_pipe_parallel_world_size"):
        return int(grid.get_pipe_parallel_world_size())
    return 1 if type(engine).__name__ == "DeepSpeedEngine" else None


def ds_memory() -> dict[str, Any]:
    """What DeepSpeed's `see_memory_usage` prints, read the same way (the peaks reset after each reading, as it
    resets them): MA, Max_MA, CA, Max_CA from DeepSpeed's accelerator, the CPU's virtual memory used."""
    import psutil
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    vm = psutil.virtual_memory()
    row = {
        "ds_accelerator": str(accelerator.device_name()),
        "ds_allocated_bytes": int(accelerator.memory_allocated()),
        "ds_peak_allocated_bytes": int(accelerator.max_memory_allocated()),
        "ds_reserved_bytes": int(accelerator.memory_reserved()),
        "ds_peak_reserved_bytes": int(accelerator.max_memory_reserved()),
        "ds_vm_used_bytes": int(vm.total - vm.available),
    }
    accelerator.reset_peak_memory_stats()
    return row
