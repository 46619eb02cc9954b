"""Benchmark results as data: a benchmark's results file carries its table and environment, docs/benchmarks.md's
tables are rendered from those files (`make bench-docs`), and a table without a file says how to make one."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import _results  # noqa: E402
import docs_tables  # noqa: E402

DOC = ROOT / "docs" / "benchmarks.md"
pytestmark = pytest.mark.timeout(60)  # file reading and rendering only: seconds


@pytest.fixture
def results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "results"
    monkeypatch.setenv("STEPSCOPE_BENCH_RESULTS", str(folder))
    return folder


def test_a_results_file_renders_as_a_table_with_its_environment(results: Path) -> None:
    # GIVEN a benchmark's printed markdown, written as a results file
    lines = [
        "best of 2.",
        "",
        "| trace | load |",
        "|---|---:|",
        "| `a` | 12 ms |",
        "| `b` | 3 ms |",
        "",
        "pool 1.1x.",
    ]
    path = _results.write_markdown_result("bench_x", "A title", lines, figures={"a": 0.012})
    document = _results.read_result(path)
    assert document["columns"] == ["trace", "load"]
    assert document["rows"] == [["`a`", "12 ms"], ["`b`", "3 ms"]]
    assert document["notes"] == ["best of 2.", "pool 1.1x."]
    env = document["environment"]
    assert env["cpu_count"] >= 1 and env["python"] and env["command"] and env["date"]
    assert env["commit"] is None or re.fullmatch(r"[0-9a-f]{40}", env["commit"])

    # WHEN a page with its marker and one without a results file is rendered
    page = (
        "# Bench\n\nmethod prose\n\n<!-- results bench_x: python benchmarks/x.py -->\nold table\n<!-- /results -->\n"
        "\nmore prose\n<!-- results bench_y: python benchmarks/y.py --fast -->\n<!-- /results -->\n"
    )
    out = docs_tables.render_page(page, results)

    # THEN the table and its environment replace the old text, the prose stays, the missing one says what to run
    assert "old table" not in out
    assert "| `a` | 12 ms |" in out and "| trace | load |" in out and "pool 1.1x." in out
    assert f"{env['cpu_count']} CPUs" in out and env["date"] in out
    assert "Not measured on this commit: run `python benchmarks/y.py --fast`." in out
    assert out.startswith("# Bench\n\nmethod prose\n") and "\nmore prose\n" in out
    assert docs_tables.render_page(out, results) == out  # rendering again changes nothing


def test_benchmarks_md_is_rendered_from_the_results_files() -> None:
    assert docs_tables.main(["--check"]) == 0, "run `make bench-docs`"


def test_every_table_names_a_benchmark_that_writes_its_results_file() -> None:
    assert len(docs_tables.MARKER.findall(DOC.read_text())) >= 10
    pages = sorted((ROOT / "docs").glob("*.md"))
    markers = [m for page in pages for m in docs_tables.MARKER.findall(page.read_text())]
    for _open, name, command, _body, _close in markers:
        script = next(word for word in command.split() if word.startswith("benchmarks/"))
        assert f'"{name}"' in (ROOT / script).read_text(), f"{script} does not write {name}.json"
