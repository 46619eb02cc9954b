"""The terminal and the HTML report show one table model: `summary` and `analyze` print the report's tables, with
the same labels and the same figures (report/columns.py names every column once)."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import pytest

from stepscope.cli import main

from ._traces import SHARED_TRACES
from .test_terminal_width import tables

TRACE = "hta_trace_compare/base/base.json.gz"  # one rank: kernels, ops and an all_reduce


class PageTables(HTMLParser):
    """Every <table id=...> of a page: its header labels and its rows (a shortened name read in full)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: dict[str, tuple[list[str], list[list[str]]]] = {}
        self._id: str | None = None
        self._cell: list[str] | None = None
        self._full: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "table" and a.get("id"):
            self._id = a["id"]
            self.found[self._id] = ([], [])
        elif self._id and tag == "tr":
            self.found[self._id][1].append([])
        elif self._id and tag in ("th", "td"):
            self._cell, self._full = [], a.get("data-full")

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)

    def handle_endtag(self, tag: str) -> None:
        if self._id and tag in ("th", "td") and self._cell is not None:
            text = self._full or "".join(self._cell).strip()
            heads, rows = self.found[self._id]
            (heads if tag == "th" else rows[-1]).append(text)
            self._cell = None
        elif tag == "table":
            self._id = None


def page_tables(path: Path) -> dict[str, tuple[list[str], list[list[str]]]]:
    parser = PageTables()
    parser.feed(path.read_text(encoding="utf-8"))
    return {tid: (heads, [r for r in rows if r]) for tid, (heads, rows) in parser.found.items()}


def terminal_tables(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, list[list[str]]]:
    """The tables a command prints (at a fixed width, names in full), by their first row: header + rows."""
    assert main([*args, "--wide"]) == 0
    return {" | ".join(cols): rows for cols, rows in tables(capsys.readouterr().out)}


@pytest.mark.shared
def test_summary_and_analyze_print_the_reports_tables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN the report of one trace (HTML, parsed)
    monkeypatch.setenv("COLUMNS", "200")
    trace = str(SHARED_TRACES / TRACE)
    page = tmp_path / "r.html"
    assert main(["report", trace, "-o", str(page)]) == 0
    capsys.readouterr()
    html = page_tables(page)
    # WHEN summary and analyze print the same trace
    printed = {**terminal_tables(["summary", trace], capsys), **terminal_tables(["analyze", trace], capsys)}
    # THEN the top kernels, the top ops and the collectives are the report's tables: labels and every cell
    for tid in ("top-kernels", "top-ops", "collectives"):
        heads, rows = html[tid]
        assert heads[0] in ("kernel", "op", "rank"), heads
        assert " | ".join(heads) in printed, (tid, heads, list(printed))
        assert printed[" | ".join(heads)] == rows, tid
