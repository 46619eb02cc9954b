"""The trace collector: torch.profiler over the schedule, one export pass per active window.

At the end of each window it writes the chrome trace (gzipped, named by rank and step), a per-rank summary
text file (top ops + memory overview) and, on the first profiled rank, a top-ops table on the console.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import resource
import shutil
import warnings
from pathlib import Path
from typing import Any

from stepscope._atomic import FILE_MODE, atomic_write_text, temp_path_beside
from stepscope.capture.collector import Collector, StepscopeWarning
from stepscope.report.terminal import fmt_bytes, fmt_us, make_console, make_table, shorten
from stepscope.runfolder import SUMMARY_TEMPLATE, TRACE_TEMPLATE

SUMMARY_ROWS = 40
GZIP_LEVEL = 6  # about torch's size (it uses 9) in much less time


class TraceCollector(Collector):
    """Owns the torch.profiler.profile of this rank; the schedule decides when it records."""

    name = "trace"
    close_order = -1  # stop first, so that a partial last window still reaches the listeners

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self.prof: Any = None
        self.windows_written = 0
        self._last_step = -1
        self._error: BaseException | None = None
        self._summary_failed = False

    def start(self) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        cfg = self.ctx.config
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self.prof = profile(
            activities=activities,
            schedule=self.ctx.schedule.to_torch(),
            on_trace_ready=self._on_trace_ready,
            record_shapes=cfg.record_shapes,
            profile_memory=cfg.profile_memory,
            with_stack=cfg.with_stack,
            with_flops=cfg.with_flops,
            with_modules=cfg.with_modules,
        )
        # torch warns at every window that events are cleared between cycles: that is what we want.
        warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle")
        self.prof.start()

    def after_step(self, step: int, record: dict[str, Any]) -> None:
        self._last_step = step
        schedule = self.ctx.schedule
        if schedule.is_traced(step + 1) and not schedule.is_traced(step) and _another_profiler_records():
            self.prof = None  # never started: dropped without stop(), the other profiler is left alone
            raise RuntimeError(
                "another torch.profiler is recording in this process (torch runs one at a time); this run's "
                "traces are off"
            )
        try:
            self.prof.step()
        except Exception:
            # torch raised inside its own state change ("Profiler is already enabled on this thread": another
            # profiler runs): stop() on such a profiler crashes the interpreter in export. Drop it untouched
            # (the profiler that is enabled is the other one); the guard switches this collector off.
            self.prof = None
            raise
        except BaseException:
            # A Ctrl-C landed inside torch's state change: the state is unknown, so nothing is exported, but
            # a profiler left enabled crashes the interpreter at exit. Disable it, then let the signal go on.
            self.prof = None
            _disable_profiler_quietly()
            raise
        self._raise_pending()

    def close(self) -> None:
        prof, self.prof = self.prof, None
        if prof is not None:
            # Stopping inside an active window exports what was recorded so far (a partial window).
            prof.stop()
        self._raise_pending()

    # --- export -----------------------------------------------------------------------------------
    def _raise_pending(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _on_trace_ready(self, prof: Any) -> None:
        # Called by torch inside prof.step()/stop(); errors are kept and re-raised after torch returns, so
        # torch's own state stays consistent and the monitor's guard switches this collector off.
        try:
            self._export(prof, self._last_step)
        except Exception as exc:
            self._error = exc

    def _export(self, prof: Any, step: int) -> None:
        ctx = self.ctx
        trace_path = ctx.path(TRACE_TEMPLATE.format(rank=ctx.rank, step=step))
        write_gzipped_trace(prof, trace_path)
        ctx.add_artifact("trace", trace_path, step)
        self.windows_written += 1
        # Other collectors' window work (memory timeline, snapshot): each is guarded on its own.
        for listener in list(ctx.window_listeners):
            listener(prof, step)

        if self._summary_failed:
            return
        try:
            self._summarise(prof, step, trace_path)
        except Exception as exc:  # torch's key_averages can fail (seen: UnicodeDecodeError with stacks)
            self._summary_failed = True
            warnings.warn(
                f"stepscope: the summary of the window ending at step {step} failed ({type(exc).__name__}: "
                f"{exc}); summaries and the console table are off for this run, traces go on",
                StepscopeWarning,
                stacklevel=2,
            )

    def _summarise(self, prof: Any, step: int, trace_path: Any) -> None:
        ctx = self.ctx
        averages = prof.key_averages()
        by_device = any(getattr(e, "self_device_time_total", 0) > 0 for e in averages)
        sort_key = "self_device_time_total" if by_device else "self_cpu_time_total"
        summary_path = ctx.path(SUMMARY_TEMPLATE.format(rank=ctx.rank, step=step))
        header = (
            f"stepscope summary: rank {ctx.rank}, window ending at step {step}, "
            f"sorted by {sort_key.replace('_total', '')}\n\n"
        )
        table = averages.table(sort_by=sort_key, row_limit=SUMMARY_ROWS)
        atomic_write_text(summary_path, header + table + "\n\n" + memory_overview() + "\n")
        ctx.add_artifact("summary", summary_path, step)

        ctx.notify("window_end", step=step, averages=averages, sort_key=sort_key, trace_path=trace_path)
        if ctx.is_first_profiled_rank and ctx.config.console:
            print_top_ops(
                averages,
                sort_key,
                ctx.config.top_n,
                title=f"stepscope: top ops, rank {ctx.rank}, window ending at step {step}",
            )


def _disable_profiler_quietly() -> None:
    """Switch torch's profiler off, discarding what it recorded (no export)."""
    import torch

    with contextlib.suppress(Exception):
        if torch._C._autograd._profiler_enabled():
            torch.autograd._disable_profiler()


def _another_profiler_records() -> bool:
    import torch

    return bool(torch._C._autograd._profiler_enabled())


def write_gzipped_trace(prof: Any, path: Path) -> None:
    """Export the window's chrome trace to `path` (.json.gz) through temp files beside it.

    torch would gzip by suffix through an uncompressed copy in the system temp folder, which a killed job leaves
    there; here both temp files are hidden files in the traces folder (loaders skip names starting with '.'),
    removed on every way out but a kill."""
    plain = temp_path_beside(path.with_name(path.name.removesuffix(".gz")))  # .json: torch writes plain JSON
    packed = temp_path_beside(path.with_name(path.name + ".part"))
    try:
        prof.export_chrome_trace(str(plain))
        with open(plain, "rb") as src, gzip.open(packed, "wb", compresslevel=GZIP_LEVEL) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        os.chmod(packed, FILE_MODE)
        os.replace(packed, path)
    finally:
        for tmp in (plain, packed):
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()


def print_top_ops(averages: Any, sort_key: str, top_n: int, title: str) -> None:
    """The console table of a window: the top ops by self device time (or self CPU time)."""
    # The ProfilerStep#N spans are whole steps, not ops: leave them out of the table and of the total.
    ops = [e for e in averages if not e.key.startswith("ProfilerStep")]
    rows_src = sorted(ops, key=lambda e: getattr(e, sort_key, 0), reverse=True)[:top_n]
    total_self = sum(getattr(e, sort_key, 0) for e in ops) or 1
    by_device = sort_key.startswith("self_device")
    columns = ["op", "calls", "self CPU", "CPU total"]
    if by_device:
        columns += ["self device", "device total"]
    columns.append("% self")
    rows = []
    for e in rows_src:
        row = [shorten(e.key, 60), e.count, fmt_us(e.self_cpu_time_total), fmt_us(e.cpu_time_total)]
        if by_device:
            row += [fmt_us(e.self_device_time_total), fmt_us(e.device_time_total)]
        row.append(f"{100.0 * getattr(e, sort_key, 0) / total_self:.1f}%")
        rows.append(row)
    make_console().print(make_table(title, columns, rows))


def memory_overview() -> str:
    """A short memory section for the summary file: process RSS and, with CUDA, the allocator's peaks."""
    import psutil
    import torch

    lines = ["Memory overview", "---------------"]
    rss = psutil.Process().memory_info().rss
    peak_rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    lines.append(f"process RSS: {fmt_bytes(rss)} now, {fmt_bytes(max(rss, peak_rss_kib * 1024))} peak")
    vm = psutil.virtual_memory()
    lines.append(f"system memory: {fmt_bytes(vm.used)} used of {fmt_bytes(vm.total)} ({vm.percent:.0f}%)")
    if torch.cuda.is_available():
        for dev in range(torch.cuda.device_count()):
            lines.append(
                f"cuda:{dev}: allocated {fmt_bytes(torch.cuda.memory_allocated(dev))}, "
                f"reserved {fmt_bytes(torch.cuda.memory_reserved(dev))}, "
                f"peak allocated {fmt_bytes(torch.cuda.max_memory_allocated(dev))}, "
                f"peak reserved {fmt_bytes(torch.cuda.max_memory_reserved(dev))}"
            )
    else:
        lines.append("CUDA: not available (CPU run)")
    return "\n".join(lines)
