"""The collective logger: CommDebugMode at `comm_logger_step`, and collective sizes/times from the traces.

At the logged step (moved out of traced windows like the FLOP counter's) each recording rank writes
`comm/rank{R}/comm_debug_{S}.txt` (a per-module forward/backward summary, then CommDebugMode's table without
colour codes) and `comm/rank{R}/comm_mode_log.json` (CommDebugMode's own JSON dump). CommDebugMode only counts;
so at the end of every traced window this collector also reads that window's trace and writes, per collective
kind, the count, bytes and time the trace holds: `comm/rank{R}/collectives_step{S}.json`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import msgspec

from stepscope._atomic import atomic_write_bytes, atomic_write_text, temp_path_beside
from stepscope.capture._instrument import (
    GLOBAL,
    ModuleNames,
    announce_placement,
    planned_steps,
    quiet_module_tracker,
    strip_ansi,
)
from stepscope.capture.collector import Collector, RunContext
from stepscope.report.terminal import fmt_bytes, fmt_us, make_console, make_table
from stepscope.runfolder import TRACE_TEMPLATE, relpath

DEBUG_TEMPLATE = "comm/rank{rank}/comm_debug_{step}.txt"
JSON_TEMPLATE = "comm/rank{rank}/comm_mode_log.json"
COLLECTIVES_TEMPLATE = "comm/rank{rank}/collectives_step{step}.json"
PHASES = ("forward", "backward")
ALL = "(all)"  # the row of every collective of the step, inside a module or not


class CommCollector(Collector):
    """Logs the collectives of one step per module (CommDebugMode) and of each window (from its trace)."""

    name = "comm"

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.step: int | None = None
        self.mode: Any = None
        self._mode_class: Any = None
        self.summary: dict[str, dict[str, dict[str, int]]] = {}
        self.totals: dict[str, int] = {}

    def start(self) -> None:
        cfg = self.ctx.config
        _, self.step = planned_steps(self.ctx.schedule, cfg.flop_counter_step, cfg.comm_logger_step)
        announce_placement(
            self.ctx, "comm_logger_step", cfg.comm_logger_step, self.step, "collective logging"
        )
        if self.step is not None:
            # Imported here (~1.5 s, torch.distributed.tensor) rather than inside a training step.
            from torch.distributed.tensor.debug import CommDebugMode

            self._mode_class = CommDebugMode

    def before_step(self, step: int) -> None:
        if step != self.step:
            return
        quiet_module_tracker()
        mode = self._mode_class()
        mode.__enter__()
        self.mode = mode

    def after_step(self, step: int, record: dict[str, Any]) -> None:
        if self.mode is None or step != self.step:
            return
        mode, self.mode = self.mode, None
        mode.__exit__(None, None, None)
        self._write_step_log(step, mode)
        record["collectives"] = sum(self.totals.values())

    def step_failed(self, step: int, exc: BaseException) -> None:
        if self.mode is not None:
            mode, self.mode = self.mode, None
            mode.__exit__(None, None, None)

    def close(self) -> None:
        if self.mode is not None:
            mode, self.mode = self.mode, None
            mode.__exit__(None, None, None)

    # --- CommDebugMode ----------------------------------------------------------------------------
    def _write_step_log(self, step: int, mode: Any) -> None:
        ctx, cfg = self.ctx, self.ctx.config
        module_counts = mode.comm_module_counts
        names = ModuleNames.build(module_counts, ctx.model)
        self.summary = module_summary(module_counts, names)
        self.totals = {_op_name(op): int(n) for op, n in mode.get_comm_counts().items()}
        table = summary_table(self.summary, self.totals, step, ctx.rank)
        header = _render(table)
        if not _dist_ready():
            header += "\ntorch.distributed is not initialized on this rank: no collective was expected.\n"
        body = strip_ansi(mode.generate_comm_debug_tracing_table(noise_level=cfg.comm_noise_level))
        debug_path = ctx.path(DEBUG_TEMPLATE.format(rank=ctx.rank, step=step))
        atomic_write_text(
            debug_path, f"{header}\nCommDebugMode table (noise level {cfg.comm_noise_level}):\n\n{body}"
        )
        ctx.add_artifact("comm_debug", debug_path, step)
        json_path = ctx.path(JSON_TEMPLATE.format(rank=ctx.rank))
        tmp = temp_path_beside(json_path)
        try:
            mode.generate_json_dump(file_name=str(tmp), noise_level=cfg.comm_noise_level)
            os.replace(tmp, json_path)
        finally:
            if tmp.exists():
                tmp.unlink()
        ctx.add_artifact("comm_json", json_path, step)
        if ctx.is_first_profiled_rank and cfg.console:
            make_console().print(table)

    # --- traces -----------------------------------------------------------------------------------
    def window_ready(self, prof: Any, step: int) -> None:
        """Read the window's trace (just exported) and write its collectives per kind."""
        ctx = self.ctx
        trace_path = ctx.run_dir / TRACE_TEMPLATE.format(rank=ctx.rank, step=step)
        if not trace_path.is_file():
            return
        from stepscope.collectives import collectives_from_trace

        summary = collectives_from_trace(trace_path)
        out = ctx.path(COLLECTIVES_TEMPLATE.format(rank=ctx.rank, step=step))
        payload = dataclasses.asdict(summary) | {"step": step, "trace": relpath(ctx.run_dir, trace_path)}
        atomic_write_bytes(out, msgspec.json.format(msgspec.json.encode(payload), indent=2) + b"\n")
        ctx.add_artifact("comm_json", out, step)
        if ctx.is_first_profiled_rank and ctx.config.console and summary.collectives:
            make_console().print(trace_table(summary.collectives, step, ctx.rank))


def _dist_ready() -> bool:
    import torch.distributed as dist

    return bool(dist.is_available() and dist.is_initialized())


def _op_name(op: Any) -> str:
    """'c10d.allreduce_' -> 'allreduce' (readable, still the c10d op)."""
    name = str(op).rsplit(".", 1)[-1]
    return name.strip("_")


def module_summary(module_counts: dict[str, Any], names: ModuleNames) -> dict[str, dict[str, dict[str, int]]]:
    """{model-relative module: {"forward"/"backward": {collective: count}}} for modules that issued any."""
    found: list[tuple[tuple[int, str], str, dict[str, dict[str, int]]]] = []
    for tracker_name, phases in module_counts.items():
        relative = GLOBAL if tracker_name == GLOBAL else names.relative(tracker_name)
        if relative is None or not isinstance(phases, dict):
            continue
        entry = {
            phase: {_op_name(op): int(n) for op, n in (phases.get(phase) or {}).items()} for phase in PHASES
        }
        if any(entry[phase] for phase in PHASES):
            if relative == GLOBAL:
                found.append(((-1, ""), ALL, entry))
            else:
                found.append((names.sort_key(relative), names.label(relative), entry))
    return {label: entry for _, label, entry in sorted(found, key=lambda item: item[0])}


def summary_table(
    summary: dict[str, dict[str, dict[str, int]]], totals: dict[str, int], step: int, rank: int
) -> Any:
    def cell(counts: dict[str, int]) -> str:
        return ", ".join(f"{op} x{n}" for op, n in sorted(counts.items())) or "-"

    rows = [[module, cell(phases["forward"]), cell(phases["backward"])] for module, phases in summary.items()]
    total = sum(totals.values())
    title = f"stepscope: collectives of step {step}, rank {rank} (CommDebugMode): {total} in all"
    return make_table(title, ["module", "forward", "backward"], rows)


def trace_table(stats: list[Any], step: int, rank: int) -> Any:
    rows = [
        [
            s.kind,
            s.count,
            fmt_bytes(s.bytes) if s.bytes is not None else "-",
            f"{fmt_us(s.time_us)} ({s.time_source})" if s.time_us is not None else "-",
            ", ".join(s.dtypes) or "-",
        ]
        for s in stats
    ]
    title = f"stepscope: collectives in the trace of the window ending at step {step}, rank {rank}"
    return make_table(title, ["collective", "count", "bytes in", "time", "dtypes"], rows)


def _render(table: Any) -> str:
    import io

    buffer = io.StringIO()
    make_console(file=buffer, width=160).print(table)
    return buffer.getvalue()
