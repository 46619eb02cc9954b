"""The job's critical path as a table (analyze's terminal and report, `stepscope whatif`)."""

from __future__ import annotations

from typing import Any

from stepscope.report import model
from stepscope.units import fmt_ms

KIND_LABELS = {
    "host": "host",
    "computation": "GPU computation",
    "communication": "communication",
    "memory": "GPU copies/fills",
    "launch": "launch latency",
    "unexplained": "unexplained wait (not in the trace)",
    "dispatch": "collective dispatch (CPU backend)",
    "gap": "gaps between kernels",
    "sync": "synchronization (own time)",
}


def job_path_table(path: Any, *, predicted: bool = False) -> model.Table:
    """The job's critical path (analysis.whatif.path.CriticalPath): per step, where its time went, by rank and
    kind, longest first."""
    columns = [
        model.Column("rank", "int"),
        model.Column("on the critical path"),
        model.Column("per step", "ms"),
        model.Column("share", "pct"),
    ]
    rows = [
        (
            s.rank,
            KIND_LABELS.get(s.what, s.what),
            s.ms,
            100.0 * s.ms / path.step_ms if path.step_ms else None,
        )
        for s in path.segments
    ]
    return model.table(
        "critical_path",
        columns,
        rows,
        title=(
            f"What would bound the predicted step: the critical path across ranks, mean of {path.steps} step(s)"
            if predicted
            else f"What bounds the step: the critical path across ranks, mean of {path.steps} step(s)"
        ),
    )


def path_line(path: Any) -> str:
    """The path's length and kinds in one line (analysis.whatif.path.CriticalPath)."""
    kinds = ", ".join(f"{kind} {fmt_ms(ms)}" for kind, ms in path.by_kind_ms.items()) or "nothing measurable"
    error = (
        f"; replayed within {abs(path.replay_error_pct):.1f}% of the measured step"
        if path.replay_error_pct is not None
        else ""
    )
    if getattr(path, "unexplained_waits", 0):
        error += (
            f"; {path.unexplained_waits:g} GPU activities a step on the path waited for what the trace does not "
            "show (unexplained wait)"
        )
    off = [f for f in getattr(path, "replay", []) if f.approximate]
    if off:
        worst = max(off, key=lambda f: abs(f.error_pct or 0.0))
        error = (
            f"; APPROXIMATE: the replay of rank {worst.rank} is {worst.error_pct:+.1f}% off its measured steps "
            f"({'; '.join(worst.reasons)})"
        )
    return (
        f"the path's {fmt_ms(path.step_ms)} per step: {kinds}{error} (the path runs from the rank whose step ends "
        "last back to the step's start on the rank it leads to: it can be longer than any one rank's step; "
        "`stepscope whatif` predicts changes)"
    )
