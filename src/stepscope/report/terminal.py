"""Terminal rendering helpers shared by every report (rich). Renderers format; they never compute."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import IO, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

# C0 and C1 control characters and DEL, shown as visible escapes: a name from a trace never drives the terminal.
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))}


def plain(value: object) -> str:
    """`value` as printable text: control characters (ESC, BEL, ...) become visible escapes like \\x1b."""
    return str(value).translate(_CONTROLS)


def markup_safe(value: object) -> str:
    """`value` to embed in a string printed with markup: printable, and its brackets not read as markup."""
    return escape(plain(value))


def make_console(file: IO[str] | None = None, width: int | None = None) -> Console:
    """A console for reports: no colour codes when writing to a file or a pipe."""
    return Console(file=file, width=width, highlight=False, soft_wrap=False)


def make_table(
    title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]], *, numeric_from: int = 1
) -> Table:
    """A rich table; columns from index `numeric_from` on are right-aligned."""
    table = Table(title=title, title_justify="left", header_style="bold", show_edge=False, pad_edge=False)
    for i, column in enumerate(columns):
        if i < numeric_from:
            table.add_column(column, justify="left", overflow="ellipsis", no_wrap=True, max_width=70)
        else:
            table.add_column(column, justify="right", no_wrap=True)
    for row in rows:
        # Cells are text, never markup: a name like "loss[/]" or "[bold]x" prints as written.
        table.add_row(*(Text(plain(cell)) for cell in row))
    return table


def fmt_us(us: float | None) -> str:
    """Microseconds as a short human duration: 812 us, 3.41 ms, 2.05 s."""
    if us is None:
        return "-"
    a = abs(us)
    if a >= 1e6:
        return f"{us / 1e6:.2f} s"
    if a >= 1e3:
        return f"{us / 1e3:.2f} ms"
    return f"{us:.1f} us" if a < 100 else f"{us:.0f} us"


def fmt_ns(ns: float | None) -> str:
    return "-" if ns is None else fmt_us(ns / 1000.0)


def fmt_pct(pct: float | None) -> str:
    return "-" if pct is None else f"{pct:.1f}%"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} TiB"


def shorten(name: str, width: int = 80) -> str:
    """Keep long kernel names readable: cut the middle, keep both ends."""
    if len(name) <= width:
        return name
    keep = (width - 3) // 2
    return name[:keep] + "..." + name[-(width - 3 - keep) :]


def kernel_label(name: str, width: int) -> str:
    """A kernel name that fits `width`: when too long, drop the leading `void ` and the parameter list
    (the template arguments say more), then cut after the first two thirds."""
    if len(name) <= width:
        return name
    short = name.removeprefix("void ")
    if short.endswith(")"):
        depth = 0
        for i in range(len(short) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(short[i], 0)
            if depth == 0:
                short = short[:i] if i > 0 else short
                break
    if len(short) <= width:
        return short
    head = (width - 3) * 2 // 3  # the start (namespace, kernel, first template argument) says the most
    return short[:head] + "..." + short[len(short) - (width - 3 - head) :]
