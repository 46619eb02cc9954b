"""The report's "Ops against the roofline": for a run recorded with shapes (or `report --roofline`), the op
groups on the device's roofline chart, the table, and time by module; otherwise a line saying what gives it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from stepscope.cli import main

from ..support.browser import visit
from ..support.output import chart_specs
from ..support.traces import SHARED_TRACES


def _section(html: Path) -> str:
    found = re.search(r'<section[^>]*id="roofline".*?</section>', html.read_text(), flags=re.S)
    assert found, "no roofline section"
    return found[0]


def _roofline_spec(html: Path) -> dict[str, Any]:
    (spec,) = [
        s
        for s in chart_specs(html)
        if any(
            layer.get("encoding", {}).get("x", {}).get("field") == "FLOP/byte" for layer in s.get("layer", [])
        )
    ]
    return spec


@pytest.fixture(scope="module")
def shaped_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    from ..support.train import profiled_run

    out = tmp_path_factory.mktemp("shaped")
    return profiled_run(
        out, 8, wait=1, warmup=1, active=2, repeat=1, record_shapes=True, with_stack=True, report=False
    )


def test_a_run_recorded_with_shapes_has_its_ops_on_the_roofline(shaped_run: Path, tmp_path: Path) -> None:
    html = tmp_path / "r.html"
    assert main(["report", str(shaped_run), "-o", str(html)]) == 0
    section = _section(html)
    assert "aten::addmm" in section and "<dt>roof</dt>" in section
    # a CPU has no roof in the table: the page says how to give one
    assert "--peak-tflops" in section
    # the module tree keeps its indentation on the page (no-break spaces: plain ones collapse)
    assert re.search("(\u00a0|&nbsp;|&#160;){2}Linear", section), "the module tree is flat"
    spec = _roofline_spec(html)
    points = spec["data"]["values"]
    assert points and {p["family"] for p in points} >= {"gemm"}
    assert all(p["TFLOP/s"] > 0 and p["FLOP/byte"] > 0 for p in points)


def test_a_run_without_shapes_says_what_gives_the_section(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from ..support.train import profiled_run

    run = profiled_run(tmp_path / "plain", 6, wait=1, warmup=1, active=2, repeat=1, report=False)
    html = tmp_path / "r.html"
    assert main(["report", str(run), "-o", str(html)]) == 0
    section = _section(html)
    assert "recorded without record_shapes=True" in section


@pytest.mark.shared
@pytest.mark.slow
def test_the_roofline_chart_draws_the_devices_roofs_and_the_ops_in_chromium(tmp_path: Path) -> None:
    trace = next((SHARED_TRACES / "tracelens_qwen1.5_h100_mi300" / "h100").glob("*.json.gz"))
    html = tmp_path / "qwen.html"
    assert main(["report", str(trace), "--roofline", "-o", str(html)]) == 0
    spec = _roofline_spec(html)
    roofs = spec["layer"][0]["data"]["values"]
    # the bf16 roof: the memory's slope up to the ridge, then the peak
    bf16 = [r for r in roofs if r["roof"] == "bf16"]
    assert max(r["TFLOP/s"] for r in bf16) == 989.5
    with visit(html) as seen:
        assert not seen.console_errors, seen.console_errors
        chart = seen.page.locator("#roofline div.chart").first
        assert chart.locator("svg.marks").count() == 1
        labels = chart.locator("g.role-axis-title text").all_text_contents()
        assert "FLOPs per byte" in labels and "achieved TFLOP/s" in labels
        assert chart.locator("g.mark-symbol path").count() >= 10  # the op groups' points
