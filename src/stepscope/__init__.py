"""stepscope: profile PyTorch training jobs and explain the result.

Public names are imported lazily so that `import stepscope` stays cheap and never imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stepscope._version import __version__

__all__ = [
    "PerformanceMonitor",
    "ProfileConfig",
    "__version__",
    "add_profiling_args",
    "performance_monitor",
    "profile_component",
]

_LAZY = {
    "performance_monitor": ("stepscope.capture.monitor", "performance_monitor"),
    "PerformanceMonitor": ("stepscope.capture.monitor", "PerformanceMonitor"),
    "ProfileConfig": ("stepscope.capture.config", "ProfileConfig"),
    "add_profiling_args": ("stepscope.integrations.args", "add_profiling_args"),
    "profile_component": ("stepscope.capture.component", "profile_component"),
}

if TYPE_CHECKING:
    from stepscope.capture.component import profile_component
    from stepscope.capture.config import ProfileConfig
    from stepscope.capture.monitor import PerformanceMonitor, performance_monitor
    from stepscope.integrations.args import add_profiling_args


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module_name, attr = _LAZY[name]
        value = getattr(importlib.import_module(module_name), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'stepscope' has no attribute {name!r}")
