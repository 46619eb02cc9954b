"""Reading what stepscope writes, as a user sees it: `analyze --json`'s document, the terminal's tables, the
report page's charts (and the page made, with what a browser must not see on it)."""

from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from stepscope.cli import main


def analyze_json(run_dir: Path) -> dict:  # type: ignore[type-arg]
    from click.testing import CliRunner

    from stepscope.cli import cli

    result = CliRunner().invoke(cli, ["analyze", str(run_dir), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)  # type: ignore[no-any-return]


def tables(out: str) -> list[tuple[list[str], list[list[str]]]]:
    """(header cells, rows of cells) of every table in `out` (rich tables without edges)."""
    lines = out.splitlines()
    found = []
    for i, line in enumerate(lines):
        if "╇" not in line:
            continue
        head = []
        k = i - 1
        while k >= 0 and "┃" in lines[k]:
            head.insert(0, lines[k])
            k -= 1
        columns = [" ".join(parts).strip() for parts in zip(*(h.split("┃") for h in head), strict=True)]
        rows = []
        k = i + 1
        while k < len(lines) and "│" in lines[k]:
            rows.append([c.strip() for c in lines[k].split("│")])
            k += 1
        found.append((columns, rows))
    return found


def chart_specs(html: Path) -> list[dict[str, Any]]:
    """Every chart spec the page embeds, in page order."""
    blocks = re.findall(
        r'<script type="application/json" id="chart-\d+-spec">(.*?)</script>', html.read_text(), flags=re.S
    )
    return [json.loads(b) for b in blocks]


SCREENSHOTS = (
    Path(os.environ.get("STEPSCOPE_SCREENSHOTS", "")) if os.environ.get("STEPSCOPE_SCREENSHOTS") else None
)


def make_report(path: Path, out: Path, *extra: str, capsys: pytest.CaptureFixture[str] | None = None) -> Path:
    code = main(["report", str(path), "-o", str(out), *extra])
    assert code == 0
    assert out.is_file()
    return out


def assert_clean(seen: object) -> None:
    assert not seen.console_errors, seen.console_errors  # type: ignore[attr-defined]
    assert not seen.remote_requests, seen.remote_requests  # type: ignore[attr-defined]
    assert not seen.dialogs, seen.dialogs  # type: ignore[attr-defined]


def load_chrome_trace(path: Path) -> dict[str, Any]:
    """Open a written trace the way a user's viewer would: gzip + JSON with traceEvents."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        data = json.load(fh)
    assert isinstance(data, dict) and isinstance(data.get("traceEvents"), list), path
    return data


def profiler_steps(path: Path) -> list[int]:
    """The N of every ProfilerStep#N span in a written trace, sorted."""
    events = load_chrome_trace(path)["traceEvents"]
    return sorted(
        int(e["name"].split("#")[1]) for e in events if str(e.get("name", "")).startswith("ProfilerStep#")
    )
