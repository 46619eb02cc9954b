"""The collective logger: CommDebugMode at `comm_logger_step`.

At the logged step (moved out of traced windows like the FLOP counter's) each recording rank writes the
collectives per module, forward and backward (kind `comm_counts`, a CommCounts payload), a text file with that
summary and CommDebugMode's table without colour codes (kind `comm_debug`), and CommDebugMode's own JSON dump
(kind `comm_json`). CommDebugMode only counts; sizes and times of the collectives come from the traces, which
analysis reads (`stepscope analyze`).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from stepscope.capture.collector import NEVER, Collector, RunContext
from stepscope.capture.collectors._instrument import (
    GLOBAL,
    ModuleNames,
    announce_placement,
    planned_steps,
    quiet_module_tracker,
    strip_ansi,
)
from stepscope.capture.console import StepscopeWarning, capture_console, warn_user
from stepscope.report.terminal import make_console, make_table
from stepscope.runfolder import ArtifactKind
from stepscope.runfolder.atomic import temp_path_beside
from stepscope.runfolder.payloads import CommCounts

PHASES = ("forward", "backward")
ALL = "(all)"  # the row of every collective of the step, inside a module or not


class CommCollector(Collector):
    """Logs the collectives of one step per module (CommDebugMode)."""

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
        if not _track_backward_without_wrapping(mode):
            mode.__exit__(None, None, None)
            warn_user(
                "stepscope: comm_logger_step is off: this torch's CommDebugMode tracks modules in the backward "
                "with a full backward hook, which wraps every module's output (an in-place op on one would "
                "then fail in your code); the collectives are still in the traces",
                StepscopeWarning,
            )
            self.step = None
            return
        self.mode = mode

    def next_busy(self, step: int) -> int:
        return self.step if self.step is not None and step <= self.step else NEVER

    def after_step(self, step: int, wall_ms: float) -> dict[str, Any] | None:
        if self.mode is None or step != self.step:
            return None
        mode, self.mode = self.mode, None
        mode.__exit__(None, None, None)
        self._write_step_log(step, mode)
        return {"collectives": sum(self.totals.values())}

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
        ctx, cfg, writer = self.ctx, self.ctx.config, self.ctx.writer
        module_counts = mode.comm_module_counts
        names = ModuleNames.build(module_counts, ctx.model)
        self.summary = module_summary(module_counts, names)
        self.totals = {_op_name(op): int(n) for op, n in mode.get_comm_counts().items()}
        distributed = _dist_ready()
        writer.write_json(
            ArtifactKind.COMM_COUNTS,
            CommCounts(
                rank=ctx.rank, step=step, totals=self.totals, modules=self.summary, distributed=distributed
            ),
            step,
        )
        table = summary_table(self.summary, self.totals, step, ctx.rank)
        header = _render(table)
        if not distributed:
            header += "\ntorch.distributed is not initialized on this rank: no collective was expected.\n"
        body = strip_ansi(mode.generate_comm_debug_tracing_table(noise_level=cfg.comm_noise_level))
        writer.write_text(
            ArtifactKind.COMM_DEBUG,
            f"{header}\nCommDebugMode table (noise level {cfg.comm_noise_level}):\n\n{body}",
            step,
        )
        json_path = writer.path(ArtifactKind.COMM_JSON, step)
        tmp = temp_path_beside(json_path)
        try:
            mode.generate_json_dump(file_name=str(tmp), noise_level=cfg.comm_noise_level)
            os.replace(tmp, json_path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        writer.add(ArtifactKind.COMM_JSON, json_path, step)
        if ctx.is_first_profiled_rank and cfg.console:
            capture_console().print(table)


def _track_backward_without_wrapping(mode: Any) -> bool:
    """Make CommDebugMode attribute backward collectives to modules without wrapping any tensor. Its module
    tracker registers a global full backward pre-hook, and a module with a full backward hook passes its outputs
    through `BackwardHookFunction`: they become views, so `out = layer(x); out += 1` in the user's forward
    raises ("Output 0 of BackwardHookFunction is a view and is being modified inplace"), and under FSDP2 torch
    warns of wrong gradients. The hook is removed before any module runs and the tracker's own pre-backward
    hook (a multi-grad hook on each module's outputs, which changes nothing) names the module instead. False
    where this torch's tracker has neither (the logger then stays off)."""
    tracker = getattr(mode, "advanced_module_tracker", None)
    handle = getattr(tracker, "_bw_handle", None)
    name_module = getattr(tracker, "_bw_hook", None)
    if (
        tracker is None
        or handle is None
        or name_module is None
        or not hasattr(tracker, "register_user_hooks")
    ):
        return False
    handle.remove()

    def pre_backward(module: Any, grad_output: Any) -> None:
        if module is None:  # (the module is gone: the collective keeps the last module's name)
            return
        # Modules that return their last child's output share that tensor, and its hooks fire innermost first;
        # a module enclosing the named one fires only there (its own backward began before its children's)
        name = tracker._get_mod_name(module)
        if name != tracker.name and name in tracker.module_parents_dict.get(tracker.name, ()):
            return
        name_module(module, grad_output)

    try:
        tracker.register_user_hooks(pre_bw_hook=pre_backward)
    except AssertionError:  # (another user hook is set)
        return False
    return True


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


def _render(table: Any) -> str:
    import io

    buffer = io.StringIO()
    make_console(file=buffer, width=160).print(table)
    return buffer.getvalue()
