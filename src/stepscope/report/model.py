"""One model of what every report shows: Sections of facts, paragraphs, charts and Tables of typed Columns.

The terminal (report/terminal/: fit_table) and the HTML pages (report/html/, templates/_macros.html.j2) render
the same objects, so a table's labels and formats are written once (report/columns.py names the shared columns). A
Column turns a value into a Cell: its text, the value a page sorts by, and the full name where the text is
shortened.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from stepscope.units import fmt_bytes, fmt_flops, fmt_ms, fmt_pct, fmt_us, short_name, significant

NAME_WIDTH = (
    90  # characters of a name shown in a page's table cell (the full name is a click or a hover away)
)
MAX_TABLE_RANKS = 8  # ranks whose ops and kernels are listed

SECTION_TITLES = {
    "anomalies": "Windows the watch opened",  # only for a watching run's (watch=True) windows
    "findings": "Findings",
    "overview": "Overview",
    "critical-path": "Critical path",
    "ops": "Kernels and ops",
    "roofline": "Ops against the roofline",  # a run recorded with shapes, or report --roofline
    "gpu": "GPU time",
    "communication": "Communication",
    "parallelism": "Parallelism",
    "ranks": "Ranks",
    "flops": "FLOPs and MFU",
    "deepspeed": "DeepSpeed",  # only for a DeepSpeed engine's run
    "memory": "Memory",
    "system": "System",
    "host": "Python and host memory",
    "perfetto": "Open the traces in Perfetto",
}


@dataclass
class Cell:
    text: str
    sort: float | str | None = None  # the value a column sorts by (the text when None)
    full: str | None = None  # the full name, for shortened names


def name_cell(name: str) -> Cell:
    short = short_name(name, NAME_WIDTH)
    return Cell(short, name, name if short != name else None)


def text_cell(value: Any) -> Cell:
    return Cell("-" if value is None else str(value))


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


def flops_cell(n: float | None) -> Cell:
    return Cell(fmt_flops(n), n if n is not None else -1)


def ratio_cell(ratio: float | None) -> Cell:
    return Cell("-" if ratio is None else f"{ratio:.2f}x", ratio or -1.0)


def gbps_cell(gbps: float | None) -> Cell:
    return Cell("-" if gbps is None else f"{gbps:.2f}", gbps or -1.0)


def rate_cell(rate: float | None) -> Cell:
    """A rate (TFLOP/s, TB/s) with three significant digits."""
    return Cell("-" if rate is None else significant(rate, 3), rate if rate is not None else -1.0)


def yes_no_cell(flag: bool) -> Cell:
    return Cell("yes" if flag else "no")


# Each kind of column: how a value becomes a cell, and whether it is a number (right-aligned, sorted by value).
_KINDS: dict[str, tuple[Callable[[Any], Cell], bool]] = {
    "text": (text_cell, False),
    "name": (name_cell, False),
    "flag": (yes_no_cell, False),
    "int": (int_cell, True),
    "us": (us_cell, True),
    "ms": (ms_cell, True),
    "pct": (pct_cell, True),
    "bytes": (bytes_cell, True),
    "flops": (flops_cell, True),
    "ratio": (ratio_cell, True),
    "gbps": (gbps_cell, True),
    "rate": (rate_cell, True),
}


@dataclass(frozen=True)
class Column:
    """A table column: its label and the kind of its values (see _KINDS). A text column that holds figures (a
    range, a count with words) is a `figure`: the terminal keeps it whole and aligns it as a number, where it
    shortens a name (a page shows every text in full)."""

    label: str
    kind: str = "text"
    figure: bool = False

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"unknown column kind {self.kind!r}")

    @property
    def numeric(self) -> bool:
        return _KINDS[self.kind][1]

    def cell(self, value: Any) -> Cell:
        """`value` formatted for this column (a Cell passes as it is: a row may format one cell its own way)."""
        return value if isinstance(value, Cell) else _KINDS[self.kind][0](value)


@dataclass
class Table:
    id: str
    columns: list[Column]
    rows: list[list[Cell]]
    caption: str = ""  # under the title on a page
    filter: bool = True  # a page offers a filter box above a long table
    title: str = ""  # the terminal's heading (a page's section heads its tables)


def table(
    id: str,
    columns: Sequence[Column],
    rows: Iterable[Sequence[Any]],
    *,
    caption: str = "",
    filter: bool = True,
    title: str = "",
) -> Table:
    """A Table whose rows are values, each formatted by its column."""
    cols = list(columns)
    cells = [[col.cell(v) for col, v in zip(cols, row, strict=True)] for row in rows]
    return Table(id, cols, cells, caption=caption, filter=filter, title=title)


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
