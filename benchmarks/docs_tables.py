"""Render the benchmark tables of docs/*.md (docs/benchmarks.md, the findings bench of docs/analysis.md) from
benchmarks/results/*.json (`make bench-docs`).

Each table in a page sits between two markers that name its results file and the command that makes it:

    <!-- results NAME: COMMAND -->
    ... generated: the table, its notes and the environment it was measured in ...
    <!-- /results -->

Everything outside the markers (the method) is prose and stays as written. Without a results file the table
says how to make one. `--check` changes nothing and exits 1 when a page is not what the results files give.

    .venv/bin/python benchmarks/docs_tables.py [--check] [--doc docs/benchmarks.md ...] [--results DIR]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import ROOT, read_result, results_dir

MARKER = re.compile(
    r"(?P<open><!-- results (?P<name>[\w.-]+): (?P<command>.+?) -->\n)(?P<body>.*?)(?P<close><!-- /results -->)",
    re.S,
)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def environment_line(env: dict[str, Any]) -> str:
    """One line that says where, when and how the figures were measured."""
    commit = (env.get("commit") or "unknown")[:10] + (" with src/ changed" if env.get("src_changed") else "")
    load = env.get("load_average_at_start")
    load_text = f", load {load[0]:.1f} at start" if load else ""
    if load and env.get("cpus_usable") and load[0] >= 0.5 * env["cpus_usable"]:
        load_text += ": a busy machine, times slower and noisier than on a quiet one"
    versions = ", ".join(
        f"{name} {env[key]}"
        for name, key in (("Python", "python"), ("numpy", "numpy"), ("torch", "torch"))
        if env.get(key)
    )
    return (
        f"Measured {env.get('date', '?')} on {env.get('machine', '?')} ({env.get('cpu', '?')}, "
        f"{env.get('cpus_usable', '?')} of {env.get('cpu_count', '?')} CPUs{load_text}), {versions}, "
        f"commit {commit}: `{env.get('command', '?')}`"
    )


def render(name: str, command: str, folder: Path) -> str:
    """The text between one pair of markers."""
    path = folder / f"{name}.json"
    if not path.is_file():
        return f"Not measured on this commit: run `{command}`.\n"
    result = read_result(path)
    columns = result["columns"]
    lines = [f"*{environment_line(result['environment'])}.*", ""]
    if columns:
        lines.append("| " + " | ".join(_cell(c) for c in columns) + " |")
        lines.append("|" + "---|" * len(columns))
        lines.extend("| " + " | ".join(_cell(c) for c in row) + " |" for row in result["rows"])
    if result.get("notes"):
        lines.append("")
        lines.extend(result["notes"])
    return "\n".join(lines) + "\n"


def render_page(text: str, folder: Path) -> str:
    def fill(match: re.Match[str]) -> str:
        body = render(match["name"], match["command"], folder)
        return match["open"] + body + match["close"]

    return MARKER.sub(fill, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--doc", type=Path, action="append", help="default: every docs/*.md with a table marker"
    )
    parser.add_argument("--results", type=Path, default=None, help="default: benchmarks/results")
    parser.add_argument("--check", action="store_true", help="exit 1 when a page is out of date")
    args = parser.parse_args(argv)
    folder = args.results or results_dir()
    docs = args.doc or sorted(p for p in (ROOT / "docs").glob("*.md") if MARKER.search(p.read_text()))
    stale = []
    for doc in docs:
        text = doc.read_text()
        page = render_page(text, folder)
        if page == text:
            continue
        stale.append(doc)
        if not args.check:
            doc.write_text(page)
    if args.check:
        for doc in stale:
            print(f"{doc} is out of date: run `make bench-docs`", file=sys.stderr)
        return 1 if stale else 0
    print(f"{len(docs)} pages, {len(stale)} rendered anew", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
