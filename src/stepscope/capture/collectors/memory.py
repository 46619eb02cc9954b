"""Memory collectors: periodic memory logging, memory timelines per active window, CUDA memory history and
snapshots (at window ends and on OOM).

torch is imported lazily. Every CUDA call sits behind `torch.cuda.is_available()`: on a CPU build the
allocator functions silently return 0 or raise, so a CPU run logs RSS and system memory only and says once
that CUDA snapshots need a GPU.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import time
import warnings
from pathlib import Path
from typing import Any

from stepscope.capture.collector import NEVER, Collector, RunContext, Window
from stepscope.capture.console import StepscopeWarning, capture_console, warn_user
from stepscope.capture.output.writer import JsonLines
from stepscope.runfolder import CONFIG_NAME, OOM_SNAPSHOT_TEMPLATE, ArtifactKind
from stepscope.runfolder.atomic import atomic_write_text, temp_path_beside
from stepscope.runfolder.payloads import MemoryRow

# Bounded history: each entry is several KB with stacks; the default (sys.maxsize) grows without limit.
SNAPSHOT_MAX_ENTRIES = 100_000
# "python" stacks only: the "all" variant (C++ too) has been reported to take minutes to dump.
SNAPSHOT_STACKS = "python"


def _fmt_bytes(n: float) -> str:
    from stepscope.report.terminal import fmt_bytes  # (rich: only once a collector prints)

    return fmt_bytes(n)


def cuda_available() -> bool:
    """True when torch has a usable CUDA device (False on CPU builds, without touching the allocator)."""
    import torch

    return bool(torch.cuda.is_available())


class MemoryLogCollector(Collector):
    """Every `memory_log_every` steps (after steps N-1, 2N-1, ...): process RSS and system memory (psutil)
    and, with CUDA, allocated / reserved / peak since the previous row (the peak is reset after each row).
    Written to the step's metrics.jsonl line, a MemoryRow per line of the rank's memory log (JSONL) and a short
    console line."""

    name = "memory_log"

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.every = int(ctx.config.memory_log_every or 0)
        self._file: JsonLines | None = None
        self._cuda = False
        self._process: Any = None
        self._console: Any = None

    def start(self) -> None:
        import psutil

        self._process = psutil.Process()
        self._cuda = cuda_available()
        self._file = self.ctx.writer.open_lines(ArtifactKind.MEMORY_LOG)
        if self.ctx.config.console and self.ctx.is_first_profiled_rank:
            self._console = capture_console()

    def next_busy(self, step: int) -> int:
        """Steps N-1, 2N-1, ...: the first of them >= `step`."""
        return step + (-(step + 1)) % self.every

    def after_step(self, step: int, wall_ms: float) -> dict[str, Any] | None:
        if (step + 1) % self.every:
            return None
        row = self.sample()
        assert self._file is not None
        extra: dict[str, Any] = {}
        if self.ctx.engine is not None:  # a DeepSpeed engine: its own memory figures on the same row
            from stepscope.capture.collectors.deepspeed import ds_memory

            extra = ds_memory()
        self._file.write(MemoryRow(step=step, unix_time=round(time.time(), 3), **row, **extra))  # type: ignore[arg-type]
        if self._console is not None:
            self._console.print(self.console_line(step, row), markup=False, highlight=False)
        return {f"mem_{k}": v for k, v in row.items() if v is not None}

    def sample(self) -> dict[str, int | float | None]:
        """One reading; CUDA fields are None without CUDA."""
        import psutil

        vm = psutil.virtual_memory()
        row: dict[str, int | float | None] = {
            "rss_bytes": self._process.memory_info().rss,
            "sys_used_bytes": vm.used,
            "sys_percent": vm.percent,
            "cuda_allocated_bytes": None,
            "cuda_reserved_bytes": None,
            "cuda_peak_allocated_bytes": None,
            "cuda_peak_reserved_bytes": None,
        }
        import torch

        # A job that never touched CUDA gets no CUDA context (hundreds of MB) from the logger.
        if self._cuda and torch.cuda.is_initialized():
            device = torch.cuda.current_device()
            row["cuda_allocated_bytes"] = torch.cuda.memory_allocated(device)
            row["cuda_reserved_bytes"] = torch.cuda.memory_reserved(device)
            row["cuda_peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
            row["cuda_peak_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
            torch.cuda.reset_peak_memory_stats(device)  # the next row's peak is that interval's peak
        return row

    def console_line(self, step: int, row: dict[str, Any]) -> str:
        line = f"stepscope memory step {step}: rss {_fmt_bytes(row['rss_bytes'])}, system {row['sys_percent']:.0f}%"
        if row["cuda_allocated_bytes"] is not None:
            line += (
                f", cuda allocated {_fmt_bytes(row['cuda_allocated_bytes'])}"
                f" reserved {_fmt_bytes(row['cuda_reserved_bytes'])}"
                f" peak {_fmt_bytes(row['cuda_peak_allocated_bytes'])}"
            )
        return line

    def close(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            file.close()


class MemoryTimelineCollector(Collector):
    """`export_memory_timeline` after each window: torch's HTML (needs matplotlib) and the raw JSON
    (`*.raw.json.gz`, what `stepscope memory` reads). It needs record_shapes, profile_memory and with_stack:
    they are turned on, with a warning when the user had not."""

    name = "memory_timeline"

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        # Runs before any collector starts, so the trace collector's profiler sees these options.
        cfg = ctx.config
        missing = [f for f in ("record_shapes", "profile_memory", "with_stack") if not getattr(cfg, f)]
        for option in missing:
            setattr(cfg, option, True)
        if missing:
            with contextlib.suppress(OSError):
                atomic_write_text(ctx.run_dir / CONFIG_NAME, cfg.to_yaml())
            warn_user(
                f"stepscope: memory_timeline=True needs {', '.join(missing)}: turned on for this run "
                "(they make active steps slower)",
                StepscopeWarning,
            )
        self._warned_html = False

    def on_window(self, window: Window) -> None:
        import torch

        # "cpu:0" silently writes an empty timeline; "cpu" is right on CPU.
        device = f"cuda:{torch.cuda.current_device()}" if cuda_available() else "cpu"
        writer, prof, step = self.ctx.writer, window.profiler, window.last_step
        raw = writer.path(ArtifactKind.MEMORY_TIMELINE, step)
        _export_timeline(prof, raw, device)
        writer.add(ArtifactKind.MEMORY_TIMELINE, raw, step)
        if not has_matplotlib():
            if not self._warned_html:
                self._warned_html = True
                warn_user(
                    "stepscope: torch's memory timeline HTML needs matplotlib (pip install matplotlib); only "
                    f"the raw timeline is written. View it offline with: stepscope memory {raw} --html OUT.html",
                    StepscopeWarning,
                )
            return
        html = writer.path(ArtifactKind.MEMORY_TIMELINE_HTML, step)
        _export_timeline(prof, html, device)
        writer.add(ArtifactKind.MEMORY_TIMELINE_HTML, html, step)


def has_matplotlib() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def _export_timeline(prof: Any, path: Path, device: str) -> None:
    """Export through a temp file beside `path` (same suffixes: torch picks the format by suffix)."""
    tmp = temp_path_beside(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # export_memory_timeline is deprecated
            prof.export_memory_timeline(str(tmp), device=device)
        if not tmp.stat().st_size:
            raise RuntimeError(f"torch wrote an empty memory timeline for device {device!r}")
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


class MemorySnapshotCollector(Collector):
    """CUDA memory history over each active window (bounded `max_entries`, Python stacks), a snapshot
    pickle when the window ends, and one when a step raises torch.OutOfMemoryError (the monitor re-raises
    it). On a CPU build: one warning, nothing else."""

    name = "memory_snapshot"

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self._cuda = False
        self._recording = False

    def start(self) -> None:
        self._cuda = cuda_available()
        if not self._cuda:
            warn_user(
                "stepscope: memory_snapshot=True: CUDA memory history and snapshots need a GPU (torch.cuda is "
                "not available); skipped, the rest of the run goes on",
                StepscopeWarning,
            )
            return
        if self.ctx.schedule.is_active(self.ctx.step):
            self._record(True)

    def next_busy(self, step: int) -> int:
        """While recording, every step; else the step before the next window (its after_step starts the
        history): a CPU run, and every step outside the windows, costs nothing."""
        if not self._cuda:
            return NEVER
        if self._recording:
            return step
        schedule = self.ctx.schedule
        active = schedule.next_traced_step(step + 1)
        if active == NEVER:
            return NEVER
        while not schedule.is_active(active):  # past the window's warmup steps
            active += 1
        return active - 1

    def after_step(self, step: int, wall_ms: float) -> None:
        # Runs before the trace collector's after_step: recording starts inside the step before the window
        # (a wait or warmup step, whose trace is discarded), so the window's own steps are not disturbed.
        if self._cuda and not self._recording and self.ctx.schedule.is_active(step + 1):
            self._record(True)

    def before_step(self, step: int) -> None:
        # Fallback when no window came (trace collector off): close the window that just ended.
        if self._recording and not self.ctx.schedule.is_active(step):
            self._dump(None, step - 1)
            self._record(False)

    def on_window(self, window: Window) -> None:
        if self._recording:
            self._dump(None, window.last_step)
            self._record(False)

    def step_failed(self, step: int, exc: BaseException) -> None:
        import torch

        if self._cuda and isinstance(exc, torch.cuda.OutOfMemoryError):
            self._dump(OOM_SNAPSHOT_TEMPLATE, step)

    def close(self) -> None:
        if self._recording:
            self._dump(None, max(self.ctx.step - 1, 0))
            self._record(False)

    def _record(self, on: bool) -> None:
        import torch

        if on:
            torch.cuda.memory._record_memory_history(
                enabled="all", stacks=SNAPSHOT_STACKS, max_entries=SNAPSHOT_MAX_ENTRIES
            )
        else:
            torch.cuda.memory._record_memory_history(enabled=None)
        self._recording = on

    def _dump(self, template: str | None, step: int) -> None:
        """A snapshot pickle: at a window end (template None), or after an OOM (OOM_SNAPSHOT_TEMPLATE)."""
        import torch

        writer = self.ctx.writer
        path = writer.path(ArtifactKind.MEMORY_SNAPSHOT, step, template=template)
        tmp = temp_path_beside(path)
        try:
            torch.cuda.memory._dump_snapshot(str(tmp))
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        writer.add(ArtifactKind.MEMORY_SNAPSHOT, path, step)
