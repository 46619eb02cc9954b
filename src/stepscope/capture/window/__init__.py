"""A profiling window's life: when windows open (the schedule's phases, on-demand requests), the trace collector
that runs torch's profiler over them, the size check before a window records (`trace_budget_mb`), the end of a
window off the training thread (export, gzip, index, the window's summary in a child process), and the stop of
a profiler whose thread ends.

Modules: `trace` (TraceCollector), `trigger` (on-demand windows: requests, claims, SIGUSR2), `budget` (how big
a window's trace will be), `window_end` (the window-end worker), `thread_exit` (stopping a profiler on its own
thread). Names are imported on first use: the trace collector pulls in the terminal's helpers, which a command
that only requests a window (`stepscope trigger`) never needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stepscope._lazy import lazy_exports

if TYPE_CHECKING:
    from stepscope.capture.window.budget import TraceBudget, TraceSize, measure_trace
    from stepscope.capture.window.thread_exit import stop_at_thread_exit
    from stepscope.capture.window.trace import TraceCollector
    from stepscope.capture.window.trigger import TriggerCollector, install_sigusr2_handler, request_window
    from stepscope.capture.window.window_end import WindowEndWorker

_EXPORTS = {
    "TraceBudget": "budget",
    "TraceCollector": "trace",
    "TraceSize": "budget",
    "TriggerCollector": "trigger",
    "WindowEndWorker": "window_end",
    "install_sigusr2_handler": "trigger",
    "measure_trace": "budget",
    "request_window": "trigger",
    "stop_at_thread_exit": "thread_exit",
}

__all__ = [
    "TraceBudget",
    "TraceCollector",
    "TraceSize",
    "TriggerCollector",
    "WindowEndWorker",
    "install_sigusr2_handler",
    "measure_trace",
    "request_window",
    "stop_at_thread_exit",
]


__getattr__ = lazy_exports(__name__, _EXPORTS)
