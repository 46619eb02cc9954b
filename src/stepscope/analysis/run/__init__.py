"""The run folder read whole (`load_run`): config, manifest, metrics, per-window summaries, the step-time trend and
the job's process groups (`job_groups`), a DeepSpeed engine's records (`deepspeed_facts`).

The names below are this package's public API, imported on first use (importing the package costs nothing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stepscope._lazy import lazy_exports

if TYPE_CHECKING:
    from stepscope.analysis.run.deepspeed import DeepSpeedFacts, deepspeed_facts
    from stepscope.analysis.run.folder import Run, RunFacts, load_run, run_facts
    from stepscope.analysis.run.groups import GroupFacts, MeshFacts, job_groups

_EXPORTS = {
    "DeepSpeedFacts": "deepspeed",
    "deepspeed_facts": "deepspeed",
    "GroupFacts": "groups",
    "MeshFacts": "groups",
    "job_groups": "groups",
    "load_run": "folder",
    "Run": "folder",
    "RunFacts": "folder",
    "run_facts": "folder",
}

__all__ = [
    "DeepSpeedFacts",
    "GroupFacts",
    "MeshFacts",
    "Run",
    "RunFacts",
    "deepspeed_facts",
    "job_groups",
    "load_run",
    "run_facts",
]


__getattr__ = lazy_exports(__name__, _EXPORTS)
