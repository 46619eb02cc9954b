"""The terminal's view of `stepscope whatif`: the job's figures, then per rank its steps and the critical path."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rich.text import Text

from stepscope.analysis.whatif.path import summarize_path
from stepscope.report import model
from stepscope.report._critical_path import KIND_LABELS as _KIND_LABELS
from stepscope.report._critical_path import job_path_table
from stepscope.report.terminal import fit_table
from stepscope.units import fmt_ms


def whatif_table(result: Any) -> model.Table:
    """Per rank: measured, replayed and predicted step time, the saving."""
    columns = [
        model.Column("rank", "int"),
        model.Column("steps", "int"),
        model.Column("measured step", "ms"),
        model.Column("replayed step", "ms"),
        model.Column("predicted step", "ms"),
        model.Column("saving", "ms"),
        model.Column("replay error", "pct"),
    ]
    rows = [
        (
            r.rank,
            r.steps,
            r.baseline_step_ms,
            r.replayed_step_ms,
            r.predicted_step_ms,
            r.saving_ms,
            r.replay.error_pct if r.replay is not None else None,
        )
        for r in result.ranks
    ]
    return model.table("whatif", columns, rows, title="Step time per rank (mean of the window's steps)")


def replay_line(result: Any) -> str:
    """The replay's own error: within REPLAY_TRUST_PCT on every rank, or which rank is off, by how much, why, and
    that the figures above and below are approximate."""
    checked = [r.replay for r in result.ranks if r.replay is not None and r.replay.error_pct is not None]
    if not checked:
        return "replay error: unknown (no measured step to check the replay against)"
    if result.approximate:
        return (
            "APPROXIMATE: "
            + "; ".join(result.approximate_reasons)
            + ". The prediction and the critical path "
            "inherit that error: read them as approximate"
        )
    worst = max((abs(e) for f in checked for e in f.step_error_pct), default=0.0)
    mean = max(abs(f.error_pct) for f in checked)
    line = (
        f"replay error: the replay with nothing changed is within {mean:.1f}% of the measured mean step on every "
        f"rank (worst step {worst:.1f}%)"
    )
    if any("rank" in n and ":" in n for n in result.notes):
        line += "; what the notes say the graph misses keeps its measured delay, and is not predicted to move"
    return line


def path_table(rank: Any) -> model.Table:
    """One rank's critical path, the mean of its steps, by kind with the host's time by phase (the kinds add up to
    the path), longest first."""
    steps = rank.critical_path
    total: dict[str, float] = {}
    for step in steps:
        for kind, ms in step.by_kind_ms.items():
            if kind != "host":  # (by phase below)
                total[kind] = total.get(kind, 0.0) + ms
        for phase, ms in step.host_by_phase_ms.items():
            total[f"host: {phase}"] = total.get(f"host: {phase}", 0.0) + ms
    n = max(len(steps), 1)
    step_ms = sum(s.step_ms for s in steps) / n
    rows = [
        (_KIND_LABELS.get(key, key), ms / n, 100.0 * ms / n / step_ms if step_ms else None)
        for key, ms in sorted(total.items(), key=lambda item: (-item[1], item[0]))
    ]
    columns = [
        model.Column("on the critical path"),
        model.Column("per step", "ms"),
        model.Column("share", "pct"),
    ]
    return model.table(
        f"path{rank.rank}",
        columns,
        rows,
        title=f"Rank {rank.rank}: the critical path, mean of {len(steps)} step(s)",
    )


def render(result: Any, *, wide: bool = False) -> Iterator[Any]:
    if result.predicted_step_ms is not None:
        line = (
            f"step (the slowest rank's mean): measured {fmt_ms(result.baseline_step_ms)}, "
            f"replayed {fmt_ms(result.replayed_step_ms)}"
        )
        if result.scale:
            line += f"; with {', '.join(result.scale)}: {fmt_ms(result.predicted_step_ms)}"
            if result.predicted_low_ms is not None:
                line += f" ({fmt_ms(result.predicted_low_ms)} to {fmt_ms(result.predicted_high_ms)})"
            line += f", saves {fmt_ms(result.saving_ms)}"
        yield line
        if result.scale and result.interval_note:
            yield Text(result.interval_note, style="dim")
        yield replay_line(result)
    yield fit_table(whatif_table(result), wide=wide)
    if len(result.ranks) > 1 and result.critical_path:
        summary = summarize_path(result.critical_path, result.replay_error_pct)
        if summary is not None:
            yield fit_table(job_path_table(summary, predicted=bool(result.scale)), wide=wide)
    for rank in result.ranks:
        yield fit_table(path_table(rank), wide=wide)
