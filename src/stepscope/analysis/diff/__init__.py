"""What changed between two runs: step times, phases, kernels, ops, findings, and regression gates.

The names below are this package's public API, imported on first use (importing the package costs nothing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stepscope._lazy import lazy_exports

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


__getattr__ = lazy_exports(__name__, _EXPORTS)
