"""Terminal rendering helpers shared by every report (rich). Renderers format; they never compute."""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterable, Sequence
from typing import IO, Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from stepscope.report import model
from stepscope.units import distinct_labels, fmt_bytes, fmt_ms, fmt_ns, fmt_pct, fmt_us, plain, short_name


def markup_safe(value: object) -> str:
    """`value` to embed in a string printed with markup: printable, and its brackets not read as markup."""
    return escape(plain(value))


def make_console(file: IO[str] | None = None, width: int | None = None) -> Console:
    """A console for reports: no colour codes, and no spaces at the ends of lines, when writing to a file or a
    pipe (rich pads titles, cells and wrapped text to their width; a log or a `diff` of two outputs would
    carry them)."""
    target = file if file is not None else sys.stdout
    isatty = getattr(target, "isatty", None)
    out: IO[str] | TrimmedLines | None = file
    if not (callable(isatty) and isatty()):
        out = TrimmedLines(file)
    # rich needs only write, flush, isatty and encoding of its file. No emoji codes: a name from a trace that
    # holds one (`:fire:`) is printed as it is, and rich's table of codes (~1.5 ms to import) is not loaded.
    return _Console(file=out, width=width, highlight=False, soft_wrap=False, emoji=False)  # type: ignore[arg-type]


class _Console(Console):
    """rich's Console, but a reader that goes away (`stepscope whatif | head -1`) ends the command as it ends
    the others, exit 0 (cli.main takes BrokenPipeError): rich's own answer is SystemExit(1)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        with contextlib.suppress(OSError, ValueError):  # (stdout closed, or not a file: nothing to silence)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        raise BrokenPipeError


class TrimmedLines:
    """A text stream that writes to `file` (None: the sys.stdout of the moment) without the spaces before each
    newline. Spaces at the end of one write wait for the next: text after them on the same line keeps them."""

    def __init__(self, file: IO[str] | None) -> None:
        self._file = file
        self._held = ""

    @property
    def target(self) -> IO[str]:
        return self._file if self._file is not None else sys.stdout

    def write(self, text: str) -> int:
        whole = self._held + text
        body = whole.rstrip(" ")
        self._held = whole[len(body) :]
        self.target.write(_SPACES_BEFORE_NEWLINE.sub("\n", body))
        return len(text)

    def flush(self) -> None:
        self.target.flush()

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self.target.fileno()

    @property
    def encoding(self) -> str:
        return getattr(self.target, "encoding", None) or "utf-8"


_SPACES_BEFORE_NEWLINE = re.compile(r" +\n")


class FitTable:
    """A table that fits the console: the number columns (from index `numeric_from` on, or those `numeric` marks)
    keep their full width and the name columns share what is left, their cells shortened by `distinct_labels` (never two
    different names alike). Where the number columns alone are too wide, their headers wrap at spaces, and what
    still does not fit goes into a table of its own below (the name columns repeated, the title marked
    "(continued)"): no number is ever cut or dropped. With `wide` (or a console wide enough) names print in
    full, in one table."""

    def __init__(
        self,
        title: str | None,
        columns: Sequence[str],
        rows: Iterable[Sequence[Any]],
        *,
        numeric_from: int = 1,
        numeric: Sequence[bool] | None = None,
        wide: bool = False,
    ) -> None:
        self.title = title
        self.columns = list(columns)
        self.rows = [[plain(cell) for cell in row] for row in rows]
        self.numeric = (
            list(numeric) if numeric is not None else [i >= numeric_from for i in range(len(columns))]
        )
        self.wide = wide

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for k, group in enumerate(self.column_groups(options.max_width)):
            title = self.title if k == 0 or not self.title else f"{self.title} (continued)"
            yield self.table(options.max_width, group, title)

    def column_groups(self, width: int) -> list[list[int]]:
        """The columns of each table to print: all of them where they fit (names shortened, headers wrapped),
        else the name columns with as many number columns as fit, then the name columns with the next ones."""
        n = len(self.columns)
        names = [i for i in range(n) if not self.numeric[i]]
        numbers = [i for i in range(n) if self.numeric[i]]
        if self.wide or not numbers:
            return [list(range(n))]
        least = {i: min(self._natural(i), max(MIN_NAME_WIDTH, _cell_width(self.columns[i]))) for i in names}
        least.update({i: self._natural(i, wrapped=True) for i in numbers})

        def fits(columns: list[int]) -> bool:
            return sum(least[i] for i in columns) + 3 * (len(columns) - 1) <= width

        groups: list[list[int]] = [[]]
        for i in numbers:
            if groups[-1] and not fits([*names, *groups[-1], i]):
                groups.append([])
            groups[-1].append(i)
        return [sorted([*names, *group]) for group in groups]

    def table(self, width: int, columns: Sequence[int] | None = None, title: str | None = None) -> Table:
        """One table of `columns` (indices; default all, with the title) fitted to `width`."""
        if columns is None:
            columns, title = list(range(len(self.columns))), self.title
        names = [i for i in columns if not self.numeric[i]]
        headers = {i: self.columns[i] for i in columns}
        natural = {i: self._natural(i) for i in columns}
        # headers wrap only where the names, shortened as far as they go, leave too little room
        shortest = {i: min(natural[i], max(MIN_NAME_WIDTH, _cell_width(self.columns[i]))) for i in names}
        if sum({**natural, **shortest}.values()) + 3 * (len(columns) - 1) > width and not self.wide:
            for i in columns:
                if i not in names:
                    natural[i] = self._natural(i, wrapped=True)
                    headers[i] = _wrapped(self.columns[i], natural[i])
        rows = [list(r) for r in self.rows]
        fixed = sum(natural[i] for i in columns if i not in names) + 3 * (len(columns) - 1)
        room = width - fixed
        if not self.wide and names and sum(natural[i] for i in names) > room:
            # the name columns share the room left, each at least MIN_NAME_WIDTH, in proportion to their need;
            # a column no wider than that keeps its width (given a proportional share, the others overflowed)
            narrow = [i for i in names if natural[i] <= MIN_NAME_WIDTH]
            shared = [i for i in names if i not in narrow]
            room -= sum(natural[i] for i in narrow)
            need = sum(natural[i] for i in shared)
            for i in shared:
                fit = max(MIN_NAME_WIDTH, room * natural[i] // need, _cell_width(self.columns[i]))
                labels = distinct_labels([r[i] if i < len(r) else "" for r in rows], fit)
                for r, label in zip(rows, labels, strict=True):
                    if i < len(r):
                        r[i] = label
                natural[i] = max([_cell_width(self.columns[i])] + [len(label) for label in labels])
        table = Table(
            title=title,
            title_justify="left",
            header_style="bold",
            show_edge=False,
            pad_edge=False,
            expand=False,
        )
        for i in columns:
            table.add_column(
                headers[i],
                justify="right" if self.numeric[i] else "left",
                no_wrap=True,
                min_width=natural[i],
                max_width=natural[i],
                overflow="fold",
            )
        for row in rows:
            # Cells are text, never markup: a name like "loss[/]" or "[bold]x" prints as written.
            table.add_row(*(Text(row[i]) if i < len(row) else Text("") for i in columns))
        return table

    def _natural(self, i: int, *, wrapped: bool = False) -> int:
        """The width column `i` needs: its longest cell, and its header (or, `wrapped`, the header's longest
        word)."""
        header = self.columns[i]
        head = max((len(w) for w in header.split()), default=0) if wrapped else _cell_width(header)
        return max([head] + [len(r[i]) for r in self.rows if i < len(r)])


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


def fit_table(table: model.Table, *, wide: bool = False) -> FitTable:
    """A model table for the terminal: its title, its columns' labels and alignment, every name in full (FitTable
    shortens names to the console's width, the page to NAME_WIDTH); numbers and figures are never shortened."""
    return FitTable(
        table.title or None,
        [c.label for c in table.columns],
        ([cell.full or cell.text for cell in row] for row in table.rows),
        numeric=[c.numeric or c.figure for c in table.columns],
        wide=wide,
    )


def _cell_width(text: str) -> int:
    return max((len(line) for line in text.split("\n")), default=0)


def _wrapped(header: str, width: int) -> str:
    """`header` broken at spaces into lines of at most `width` (a longer word keeps its own line)."""
    lines = []
    for part in header.split("\n"):
        line = ""
        for word in part.split():
            if line and len(line) + 1 + len(word) > width:
                lines.append(line)
                line = word
            else:
                line = f"{line} {word}" if line else word
        lines.append(line)
    return "\n".join(lines)


MIN_NAME_WIDTH = 12


__all__ = [
    "FitTable",
    "distinct_labels",
    "fit_table",
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
