"""What the report's charts say, read from the specs the page embeds (and, where a browser is installed, from the
drawn page): steps on whole-number ticks."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import pytest

import stepscope
from stepscope.cli import main

from ..support.browser import visit
from ..support.output import chart_specs
from ..support.train import make_training


def encodings(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The encodings of a spec and of its layers."""
    return [e for part in (spec, *spec.get("layer", [])) if (e := part.get("encoding"))]


def step_axes(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every quantitative x channel over steps."""
    return [
        e["x"]
        for s in specs
        for e in encodings(s)
        if e.get("x", {}).get("field") == "step" and e["x"].get("type") == "quantitative"
    ]


@pytest.fixture(scope="module")
def short_run_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The report of a real 4-step run: a step axis this short got ticks at 0.2, 0.4, ..."""
    out = tmp_path_factory.mktemp("short")
    train_step, model = make_training()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        monitor = stepscope.performance_monitor(
            model,
            out_dir=str(out),
            wait=1,
            warmup=0,
            active=2,
            memory_log_every=1,
            report=False,
            console=False,
        )
        step = monitor(train_step)
        for _ in range(4):
            step()
        monitor.close()
    assert monitor.run_dir is not None
    html = out / "report.html"
    assert main(["report", str(monitor.run_dir), "-o", str(html)]) == 0
    return html


def test_step_axes_tick_on_whole_steps(short_run_report: Path) -> None:
    specs = chart_specs(short_run_report)
    assert len([s for s in specs if step_axes([s])]) == 2  # the run's step times and its memory log
    for x in step_axes(specs):  # (every layer's, the window-end marks' included)
        assert x["axis"]["format"] == "d" and x["axis"]["tickMinStep"] == 1


@pytest.mark.slow
def test_step_axis_drawn_with_whole_steps_only(short_run_report: Path) -> None:
    with visit(short_run_report) as seen:
        assert not seen.console_errors, seen.console_errors
        chart = seen.page.locator("#overview div.chart").first
        labels = chart.locator("g.role-axis[aria-label^='X-axis'] g.role-axis-label text").all_text_contents()
        assert labels and all(re.fullmatch(r"\d+", t) for t in labels), labels
        assert len(set(labels)) == len(labels)
