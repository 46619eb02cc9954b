"""What changed between two runs: step times, phases, kernels, ops, findings, and regression gates.

The names below are this package's public API, imported on first use (importing the package costs nothing).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stepscope.analysis.diff.compare import (
        DIFF_SCHEMA,
        PHASE_LABELS,
        Delta,
        Diff,
        FindingChange,
        diff_paths,
        diff_tables,
    )
    from stepscope.analysis.diff.gates import evaluate_gates, parse_gate
    from stepscope.analysis.diff.steps import StepComparison

_EXPORTS = {
    "diff_paths": "compare",
    "diff_tables": "compare",
    "Diff": "compare",
    "Delta": "compare",
    "FindingChange": "compare",
    "PHASE_LABELS": "compare",
    "DIFF_SCHEMA": "compare",
    "StepComparison": "steps",
    "evaluate_gates": "gates",
    "parse_gate": "gates",
}

__all__ = [
    "DIFF_SCHEMA",
    "PHASE_LABELS",
    "Delta",
    "Diff",
    "FindingChange",
    "StepComparison",
    "diff_paths",
    "diff_tables",
    "evaluate_gates",
    "parse_gate",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
