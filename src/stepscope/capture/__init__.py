"""Capture: what runs inside training. The monitor (`monitor`: the step loop and its guard) with its options
(`config`), the collectors' shared contract (`collector`), the schedule (`schedule`), what capture says to
the user (`console`: warnings at the user's line, the stderr console); a window's life
(`window/`), the collectors beside the trace (`collectors/`), what a rank writes into its run folder
(`output/`); and the entry points built on the monitor: `component` (one function or module at a time),
`zero` (`stepscope run`), `estimate` (`stepscope estimate`), `demo`.

Nothing here imports torch until a monitor records; names are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stepscope._lazy import lazy_exports

if TYPE_CHECKING:
    from stepscope.capture.collector import Collector, RunContext, Window
    from stepscope.capture.component import profile_component
    from stepscope.capture.config import ProfileConfig
    from stepscope.capture.console import StepscopeWarning
    from stepscope.capture.monitor import PerformanceMonitor, performance_monitor
    from stepscope.capture.schedule import Phase, Schedule

_EXPORTS = {
    "Collector": "collector",
    "PerformanceMonitor": "monitor",
    "Phase": "schedule",
    "ProfileConfig": "config",
    "RunContext": "collector",
    "Schedule": "schedule",
    "StepscopeWarning": "console",
    "Window": "collector",
    "performance_monitor": "monitor",
    "profile_component": "component",
}

__all__ = [
    "Collector",
    "PerformanceMonitor",
    "Phase",
    "ProfileConfig",
    "RunContext",
    "Schedule",
    "StepscopeWarning",
    "Window",
    "performance_monitor",
    "profile_component",
]


__getattr__ = lazy_exports(__name__, _EXPORTS)
