"""The report's critical-path section: what bounds the step (analyze's `critical_path`), its table, and a typical
step's path drawn over the step's work on every lane."""

from __future__ import annotations

from typing import Any

import msgspec

from stepscope.report._critical_path import KIND_LABELS, job_path_table, path_line
from stepscope.report.data import ReportData
from stepscope.report.html import charts
from stepscope.report.model import SECTION_TITLES, Charts, Section
from stepscope.units import fmt_ms


def critical_path(data: ReportData, pc: Charts) -> Section:
    s = Section("critical-path", SECTION_TITLES["critical-path"])
    path = data.analysis.critical_path
    if path is None or not path.segments:
        s.empty = "no step to replay in the traces: no critical path"
        return s
    if path.bound is not None:
        s.facts.append(("bounds the step", path.bound))
    s.paragraphs.append(path_line(path).replace("`", "").capitalize() + ".")
    t = path.timeline
    if t is not None and t.step_ms > 0:
        which = (
            f"Step {t.step}, a typical one (the step whose path, {fmt_ms(t.step_ms)}, is the median's)"
            if t.step is not None
            else f"The whole traced window ({fmt_ms(t.step_ms)}: no ProfilerStep marks its steps)"
        )
        clocks = (
            ""
            if t.aligned
            else " No collective was matched across the ranks, so their clocks are not aligned: each rank is "
            "drawn from its own step's start."
        )
        pc.add(
            s,
            charts.path_timeline(_plain(t.path), _plain(t.busy)),
            f"{which}: a row for each rank's host and streams, the step's work faint and its critical path in "
            "full colour, outlined, over it. The path runs back from the end of the rank whose step ends last; "
            "where a collective waited for a later rank, it passes to that rank. Hover a bar for what it is."
            + clocks,
        )
    s.tables.append(job_path_table(path))
    return s


def _plain(spans: list[Any]) -> list[dict[str, Any]]:
    """The spans as the chart takes them, each kind by its label in the path's table."""
    out = []
    for x in spans:
        d = msgspec.structs.asdict(x)
        d["what"] = KIND_LABELS.get(d["what"], d["what"])
        out.append(d)
    return out
