"""The critical path of a typical step on a timeline: analyze's `critical_path.timeline` and the report's chart of
it (#29)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stepscope.analysis.read.loader import load_trace

from ..support.synthetic import gpu_step as _gpu_step
from ..support.traces import SHARED_TRACES


def _analyze(path: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    from stepscope.cli import main

    assert main(["analyze", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _length(spans: list[dict]) -> float:
    return sum(s["end_ms"] - s["start_ms"] for s in spans)


def test_the_timeline_shows_the_steps_path_over_its_work(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # GIVEN one step whose host launches two kernels (600 + 200 us) and waits for them, then runs the optimizer
    path = _gpu_step(tmp_path)
    # WHEN analyze reads it
    timeline = _analyze(path, capsys)["critical_path"]["timeline"]
    # THEN the path runs from the forward's launch through both kernels, the synchronization's own time and
    # the optimizer, and its stretches add up to the step
    assert timeline["step"] == 1
    assert _length(timeline["path"]) == pytest.approx(timeline["step_ms"]) == pytest.approx(1.0)
    kernels = [
        (s["name"], round(s["end_ms"] - s["start_ms"], 3)) for s in timeline["path"] if s["lane"] != "host"
    ]
    assert ("gemm_A", 0.6) in kernels and ("gemm_B", 0.2) in kernels
    host = {s["what"] for s in timeline["path"] if s["lane"] == "host"}
    assert {"host: forward", "sync", "host: optimizer"} <= host
    starts = [s["start_ms"] for s in timeline["path"]]
    assert starts == sorted(starts)
    # and the work under it: the host's phases and synchronization, the stream's kernels
    busy = {(s["lane"], s["what"]) for s in timeline["busy"]}
    assert {("host", "host: forward"), ("host", "sync"), ("host", "host: optimizer")} <= busy
    assert any(what == "computation" and lane != "host" for lane, what in busy)


@pytest.mark.shared
def test_the_timeline_adds_up_to_the_path_on_every_shared_trace(capsys: pytest.CaptureFixture) -> None:
    """A typical step's path, drawn: on every shared trace it adds up to that step's path, in time order, within
    the chart's bound of spans, on lanes the step's work names."""
    if not SHARED_TRACES.is_dir():
        pytest.skip("../shared/traces is absent")
    checked = 0
    # every trace, and the folder of two unrelated ResNet-50 runs (no collective aligns their clocks)
    folder = SHARED_TRACES / "kineto_resnet50_num_workers_4"
    for path in [*sorted(SHARED_TRACES.rglob("*.json*")), folder]:
        try:
            load_trace(path)
        except Exception:
            continue  # the bad-input traces of the set
        doc = _analyze(path, capsys)
        path_doc = doc.get("critical_path")
        if path_doc is None:
            continue
        timeline = path_doc["timeline"]
        spans = timeline["path"]
        assert len(spans) <= 1500 and len(timeline["busy"]) <= 600, path
        # a thousandth of the step may be joined across (timeline._joined_path)
        assert _length(spans) == pytest.approx(timeline["step_ms"], rel=1e-3, abs=0.001), path
        assert [s["start_ms"] for s in spans] == sorted(s["start_ms"] for s in spans), path
        # from the step's start (a queue it inherited is not drawn), on clocks aligned or each rank's own
        assert min(s["start_ms"] for s in spans) >= 0, path
        assert max(s["end_ms"] for s in spans) <= 1.5 * timeline["step_ms"] + 0.001, path
        # the step's number, or None where no ProfilerStep marks steps (the window drawn whole)
        marked = any(r["steps"] for r in doc["ranks"])
        assert (timeline["step"] is not None) == marked, path
        if path == folder:
            assert timeline["aligned"] is False
        lanes = {(s["rank"], s["lane"]) for s in timeline["busy"]} | {(s["rank"], "host") for s in spans}
        assert {(s["rank"], s["lane"]) for s in spans} <= lanes, path
        checked += 1
    assert checked >= 15


@pytest.mark.shared
def test_the_report_draws_the_path_on_a_timeline(tmp_path: Path) -> None:
    """The report of the two-rank DLRM trace: its Critical path section says what bounds the step, draws the path
    over both ranks' lanes, and tables the path by rank and kind."""
    from stepscope.cli import main

    from ..support.browser import visit

    traces = SHARED_TRACES / "hta_trace_filter"
    if not traces.is_dir():
        pytest.skip("../shared/traces is absent")
    page = tmp_path / "report.html"
    assert main(["report", str(traces), "-o", str(page)]) == 0
    with visit(page) as seen:
        assert not seen.console_errors, seen.console_errors
        assert not seen.remote_requests, seen.remote_requests
        section = seen.page.locator("section#critical-path")
        assert section.locator("h2").first.text_content().strip() == "Critical path"
        assert "host: backward" in section.text_content()
        assert section.locator("div.chart svg.marks").count() == 1
        # both ranks' host and streams are rows of the chart
        labels = section.locator("div.chart svg text").all_text_contents()
        assert "rank 0 · host" in labels and "rank 1 · host" in labels
        assert any(t.startswith("rank 1 · stream") for t in labels)
        assert section.locator("table#critical_path tbody tr").count() >= 3
        section.screenshot(path=str(tmp_path / "critical_path.png"))
