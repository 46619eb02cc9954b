"""The run folder read whole (`load_run`): config, manifest, metrics, per-window summaries, the step-time trend and
the job's process groups (`job_groups`).

The names below are this package's public API, imported on first use (importing the package costs nothing).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stepscope.analysis.run.folder import Run, RunFacts, load_run, read_config, run_facts
    from stepscope.analysis.run.groups import GroupFacts, MeshFacts, job_groups

_EXPORTS = {
    "GroupFacts": "groups",
    "MeshFacts": "groups",
    "job_groups": "groups",
    "load_run": "folder",
    "Run": "folder",
    "RunFacts": "folder",
    "run_facts": "folder",
    "read_config": "folder",
}

__all__ = [
    "GroupFacts",
    "MeshFacts",
    "Run",
    "RunFacts",
    "job_groups",
    "load_run",
    "read_config",
    "run_facts",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
