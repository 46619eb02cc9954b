"""View objects of the HTML pages (sections, tables, cells, charts) and the cell formatters they share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stepscope.units import fmt_bytes, fmt_ms, fmt_pct, fmt_us, short_name

NAME_WIDTH = 90  # characters of a name shown in a table cell (the full name is a click or a hover away)
MAX_TABLE_RANKS = 8  # ranks whose ops and kernels are listed

# Which section shows the evidence of each finding.
FINDING_SECTIONS = {
    "data_loader_stall": "overview",
    "step_breakdown": "overview",
    "host_bound": "gpu",
    "launch_bound": "gpu",
    "tiny_kernels": "gpu",
    "sync_points": "gpu",
    "pageable_copies": "gpu",
    "python_overhead": "ops",
    "optimizer_bound": "ops",
    "many_small_ops": "ops",
    "comm_bound": "communication",
    "poor_overlap": "communication",
    "collective_slow": "communication",
    "straggler": "ranks",
}
SECTION_TITLES = {
    "findings": "Findings",
    "overview": "Overview",
    "ops": "Kernels and ops",
    "gpu": "GPU time",
    "communication": "Communication",
    "ranks": "Ranks",
    "flops": "FLOPs and MFU",
    "memory": "Memory",
    "system": "System",
    "perfetto": "Open the traces in Perfetto",
}


@dataclass
class Cell:
    text: str
    sort: float | str | None = None  # the value a column sorts by (the text when None)
    full: str | None = None  # the full name, for shortened names


@dataclass
class Table:
    id: str
    columns: list[tuple[str, bool]]  # (header, numeric)
    rows: list[list[Cell]]
    caption: str = ""
    filter: bool = True


@dataclass
class Section:
    id: str
    title: str
    empty: str | None = None  # why there is nothing to show
    facts: list[tuple[str, str]] = field(default_factory=list)
    paragraphs: list[str] = field(default_factory=list)
    charts: list[tuple[str, str]] = field(default_factory=list)  # (chart id, caption)
    tables: list[Table] = field(default_factory=list)
    items: list[str] = field(default_factory=list)  # a plain list (file names, notes)


class Charts:
    """Chart specs of one page, each given an id; the page embeds them as JSON."""

    def __init__(self) -> None:
        self.specs: dict[str, dict[str, Any]] = {}

    def add(self, section: Section, spec: dict[str, Any] | None, caption: str) -> bool:
        if spec is None:
            return False
        chart_id = f"chart-{len(self.specs) + 1}"
        self.specs[chart_id] = spec
        section.charts.append((chart_id, caption))
        return True


# ------------------------------------------------------------------------------------------------ cells
def name_cell(name: str) -> Cell:
    short = short_name(name, NAME_WIDTH)
    return Cell(short, name, name if short != name else None)


def us_cell(us: float | None) -> Cell:
    return Cell(fmt_us(us), us if us is not None else -1.0)


def ms_cell(ms: float | None) -> Cell:
    return Cell(fmt_ms(ms), ms if ms is not None else -1.0)


def pct_cell(pct: float | None) -> Cell:
    return Cell(fmt_pct(pct), pct if pct is not None else -1.0)


def int_cell(n: int | None) -> Cell:
    return Cell("-" if n is None else f"{n:,}", n if n is not None else -1)


def bytes_cell(n: int | None) -> Cell:
    return Cell(fmt_bytes(n), n if n is not None else -1)
