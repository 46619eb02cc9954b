"""The terminal and the HTML report show one table model: `summary` and `analyze` print the report's tables, with
the same labels and the same figures (report/columns.py names every column once); `diff` and `memory` print the
compare page's and the memory page's."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import pytest

from stepscope.cli import main

from ..support.output import tables
from ..support.traces import SHARED_TRACES

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


DIFF = ("hta_trace_compare/base/base.json.gz", "hta_trace_compare/test/test.json.gz")


@pytest.mark.shared
def test_diff_prints_the_compare_pages_tables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN the compare page of two traces (HTML, parsed)
    monkeypatch.setenv("COLUMNS", "200")
    base, test = (str(SHARED_TRACES / p) for p in DIFF)
    page = tmp_path / "c.html"
    assert main(["report", base, "--compare", test, "-o", str(page)]) == 0
    capsys.readouterr()
    html = page_tables(page)
    # WHEN diff prints the same two runs
    printed = terminal_tables(["diff", base, test], capsys)
    # THEN its step-time table is the page's (the steps compared are a line below it in the terminal)
    heads, rows = html["step-time-table"]
    assert heads[-1] == "steps compared"
    assert printed[" | ".join(heads[:-1])] == [r[:-1] for r in rows]
    # ... and its phase table shows the page's phases, times and intervals under the page's labels; the terminal
    # signs the changes and marks with '~' what the page calls not significant where there is an interval (where
    # too few values bound none, the interval column says so and nothing is marked)
    heads, rows = html["phase-table"]
    assert heads[-1] == "significant"
    terminal = printed[" | ".join([*heads[:-1], "~"])]
    assert [[r[0], r[1], r[2], r[5]] for r in terminal] == [[r[0], r[1], r[2], r[5]] for r in rows]
    assert [r[-1] == "~" for r in terminal] == [r[-1] == "no" and r[5] != "too few" for r in rows]
    assert [r[4].lstrip("+") for r in terminal] == [r[4] for r in rows]  # the change in %


def test_memory_prints_the_memory_pages_tables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import pickle

    from ..support.memory_data import snapshot

    # GIVEN a snapshot and its memory page
    monkeypatch.setenv("COLUMNS", "200")
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(snapshot()))
    page = tmp_path / "m.html"
    # WHEN the memory command prints it and writes the page
    assert main(["memory", str(path), "--html", str(page)]) == 0
    printed = {" | ".join(cols): rows for cols, rows in tables(capsys.readouterr().out)}
    # THEN the devices table is the page's, label for label and figure for figure
    heads, rows = page_tables(page)["devices-table"]
    assert heads == ["", "cuda:0"]
    assert printed[" | ".join(heads)] == rows
    assert ["fragmentation", "32.7%"] in rows
