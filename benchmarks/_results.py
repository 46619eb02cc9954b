"""Benchmark results as data: each benchmark writes its table and the environment it ran in to
`benchmarks/results/<name>.json`, and `docs_tables.py` renders docs/benchmarks.md's tables from those files.

A figure is only as good as the machine it came from, so every file says where, when and how it was measured:
the host and its CPUs, the load average (1, 5, 15 min) when the run began (a shared machine slows everything it runs), the
Python / numpy / torch versions, the commit (and whether src/ differed from it) and the command line.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Iterable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = "stepscope.benchmark/1"
# Benchmarks measure decoding: the cache of decoded tables (analysis/read/cache.py) would serve every round after
# the first. bench_cache.py, which measures the cache, sets its own environment for its commands.
os.environ.setdefault("STEPSCOPE_NO_CACHE", "1")
# taken when the benchmark starts (it imports this module first), before its own work loads the machine
START_LOAD = [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def results_dir() -> Path:
    """Where results files go: benchmarks/results, or $STEPSCOPE_BENCH_RESULTS (tests write elsewhere)."""
    return Path(os.environ.get("STEPSCOPE_BENCH_RESULTS") or ROOT / "benchmarks" / "results")


def _version(package: str) -> str | None:
    # the installed distribution's version, without importing it (importing torch takes seconds)
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _git(*args: str) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command as one would type it from the repository root: `.venv/bin/python benchmarks/x.py ...`."""
    args = list(sys.argv if argv is None else argv)
    script = Path(args[0]).resolve() if args else Path()
    if script.is_relative_to(ROOT):
        args[0] = str(script.relative_to(ROOT))
    python = Path(sys.executable)
    python_text = str(python.relative_to(ROOT)) if python.is_relative_to(ROOT) else python.name
    return shlex.join([python_text, *args])


def environment(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Where, when and how this process measures."""
    try:
        cpus_usable = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus_usable = os.cpu_count()
    commit = _git("rev-parse", "HEAD")
    return {
        "machine": platform.node(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": cpus_usable,
        "load_average_at_start": START_LOAD,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": _version("numpy"),
        "torch": _version("torch"),
        "stepscope": _version("stepscope"),
        "commit": commit or None,
        # the figures are the commit's only where src/ is as committed (a benchmark's own edits do not count)
        "src_changed": bool(_git("status", "--porcelain", "--untracked-files=no", "--", "src"))
        if commit
        else None,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command_line(argv),
    }


def write_result(
    name: str,
    title: str,
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    figures: Any = None,
    notes: Sequence[str] = (),
    env: dict[str, Any] | None = None,
) -> Path:
    """Write `<results>/<name>.json`: the table as printed (cells as text), the raw figures behind it, the notes
    that belong under it and the environment. Returns the path (also said on stderr)."""
    document = {
        "schema": SCHEMA,
        "name": name,
        "title": title,
        "environment": env if env is not None else environment(),
        "columns": list(columns),
        "rows": [[str(cell) for cell in row] for row in rows],
        "notes": list(notes),
        "figures": figures,
    }
    folder = results_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(document, indent=1, default=str) + "\n")
    tmp.replace(path)
    print(f"results: {path}", file=sys.stderr)
    return path


def read_result(path: Path) -> dict[str, Any]:
    document = json.loads(path.read_text())
    if document.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a benchmark results file (schema {document.get('schema')!r})")
    return document


def split_markdown(lines: Iterable[str]) -> tuple[list[str], list[list[str]], list[str]]:
    """A benchmark's printed markdown as (columns, rows, notes): the first table's header and rows, and every
    other non-empty line as a note, for the benchmarks that build their table as text."""
    columns: list[str] = []
    rows: list[list[str]] = []
    notes: list[str] = []
    in_table = done = False
    for line in (part for text in lines for part in text.splitlines()):
        if line.startswith("|") and not done:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not in_table:
                columns, in_table = cells, True
            elif not set(line) <= set("|-: "):
                rows.append(cells)
            continue
        done = done or in_table
        if line.strip():
            notes.append(line)
    return columns, rows, notes


def write_markdown_result(name: str, title: str, lines: Iterable[str], *, figures: Any = None) -> Path:
    """`write_result` for a benchmark that prints its table as markdown lines."""
    columns, rows, notes = split_markdown(lines)
    return write_result(name, title, columns, rows, figures=figures, notes=notes)
