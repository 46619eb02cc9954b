"""Terminal rendering helpers shared by every report (rich). Renderers format; they never compute."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import IO, Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from stepscope.units import distinct_labels, fmt_bytes, fmt_ms, fmt_ns, fmt_pct, fmt_us, plain, short_name


def markup_safe(value: object) -> str:
    """`value` to embed in a string printed with markup: printable, and its brackets not read as markup."""
    return escape(plain(value))


def make_console(file: IO[str] | None = None, width: int | None = None) -> Console:
    """A console for reports: no colour codes when writing to a file or a pipe."""
    return Console(file=file, width=width, highlight=False, soft_wrap=False)


class FitTable:
    """A table that fits the console: the number columns (from index `numeric_from` on) keep their full width and
    the name columns before them share what is left, their cells shortened by `distinct_labels` (never two
    different names alike). With `wide` (or a console wide enough) names print in full."""

    def __init__(
        self,
        title: str | None,
        columns: Sequence[str],
        rows: Iterable[Sequence[Any]],
        *,
        numeric_from: int = 1,
        wide: bool = False,
    ) -> None:
        self.title = title
        self.columns = list(columns)
        self.rows = [[plain(cell) for cell in row] for row in rows]
        self.numeric_from = numeric_from
        self.wide = wide

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.table(options.max_width)

    def table(self, width: int) -> Table:
        n = len(self.columns)
        natural = [
            max([_cell_width(self.columns[i])] + [len(r[i]) for r in self.rows if i < len(r)])
            for i in range(n)
        ]
        rows = [list(r) for r in self.rows]
        names = list(range(min(self.numeric_from, n)))
        fixed = sum(natural[i] for i in range(n) if i not in names) + 3 * (n - 1)
        room = width - fixed
        if not self.wide and names and sum(natural[i] for i in names) > room:
            # the name columns share the room left, each at least MIN_NAME_WIDTH, in proportion to their need
            need = sum(natural[i] for i in names)
            for i in names:
                fit = max(MIN_NAME_WIDTH, room * natural[i] // need, _cell_width(self.columns[i]))
                labels = distinct_labels([r[i] if i < len(r) else "" for r in rows], fit)
                for r, label in zip(rows, labels, strict=True):
                    if i < len(r):
                        r[i] = label
                natural[i] = max([_cell_width(self.columns[i])] + [len(label) for label in labels])
        table = Table(
            title=self.title,
            title_justify="left",
            header_style="bold",
            show_edge=False,
            pad_edge=False,
            expand=False,
        )
        for i, column in enumerate(self.columns):
            table.add_column(
                column,
                justify="left" if i < self.numeric_from else "right",
                no_wrap=True,
                min_width=natural[i],
                max_width=natural[i],
                overflow="fold",
            )
        for row in rows:
            # Cells are text, never markup: a name like "loss[/]" or "[bold]x" prints as written.
            table.add_row(*(Text(cell) for cell in row))
        return table


def make_table(
    title: str | None,
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    numeric_from: int = 1,
    wide: bool = False,
) -> FitTable:
    """A table that fits the console (see FitTable); columns from index `numeric_from` on are right-aligned."""
    return FitTable(title, columns, rows, numeric_from=numeric_from, wide=wide)


def _cell_width(text: str) -> int:
    return max((len(line) for line in text.split("\n")), default=0)


MIN_NAME_WIDTH = 12


__all__ = [
    "FitTable",
    "distinct_labels",
    "fmt_bytes",
    "fmt_ms",
    "fmt_ns",
    "fmt_pct",
    "fmt_us",
    "make_console",
    "make_table",
    "markup_safe",
    "plain",
    "short_name",
]
