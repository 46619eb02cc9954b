"""`stepscope report`: the self-contained HTML page, checked through the CLI and in a real headless Chromium."""

from __future__ import annotations

import html as htmllib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stepscope.cli import main
from stepscope.runfolder import read_manifest

from ..support.browser import visit
from ..support.jobs import torchrun
from ..support.output import SCREENSHOTS, assert_clean, chart_specs, make_report
from ..support.traces import SHARED_TRACES, cpu, launched, step, write_trace

SECTIONS = [
    "findings",
    "overview",
    "critical-path",
    "ops",
    "roofline",
    "gpu",
    "communication",
    "parallelism",
    "ranks",
    "flops",
    "memory",
    "system",
    "host",
    "perfetto",
]

HOSTILE = [
    "<script>window.__pwned=1;alert(1)</script>",
    "</script><script>window.__pwned=2;alert(2)</script>",
    '" onload="window.__pwned=3" x="',
    "javascript:window.__pwned=4",
    '<img src=x onerror="window.__pwned=5;alert(5)">',
    "]]></script><!--<script>window.__pwned=6</script>",
    "\u2028</script>\u2029",
]


def section_ids(page: object) -> list[str]:
    ids = page.eval_on_selector_all("main > section", "els => els.map(e => e.id)")  # type: ignore[attr-defined]
    return [i for i in ids if i != "notes"]


def screenshot(page: object, name: str) -> None:
    if SCREENSHOTS is not None:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / name), full_page=True)  # type: ignore[attr-defined]


def hostile_trace(path: Path) -> Path:
    """Two steps whose ops, annotations, kernels and args carry script-injection attempts."""
    events = []
    corr = 1
    for n, t0 in ((1, 0.0), (2, 1000.0)):
        events.append(step(n, t0, 900))
        for i, name in enumerate(HOSTILE):
            events.append(cpu(name, t0 + 10 + 100 * i, 50, note=name, **{name[:20]: name}))
            events.extend(launched(name, t0 + 20 + 100 * i, t0 + 30 + 100 * i, 40, corr))
            corr += 1
        events.append(cpu(HOSTILE[1], t0 + 800, 50, cat="user_annotation"))
    return write_trace(path, events, rank=0, world_size=1)


def findings_job(tmp_path: Path, job: str) -> Path:
    """Run one job of the findings bench (a real CPU training under the monitor); its run folder."""
    script = Path(__file__).parents[1] / "support" / "jobs" / "findings.py"
    env = dict(os.environ, PYTHONPATH=str(script.parents[3]), OMP_NUM_THREADS="1")
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path), job],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return next((tmp_path / job).iterdir())


# ------------------------------------------------------------------------------------------------ no browser
def test_report_of_a_trace_is_one_offline_file_with_a_csp(tmp_path: Path) -> None:
    trace = hostile_trace(tmp_path / "hostile.json")
    out = make_report(trace, tmp_path / "r.html")
    html = out.read_text()
    # THEN it names no remote resource and carries a CSP that forbids loads and allows only its own scripts
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', html)
    assert csp is not None
    policy = htmllib.unescape(csp.group(1))
    assert "default-src 'none'" in policy and "unsafe-eval" not in policy
    script_src = re.search(r"script-src ([^;]+)", policy)
    assert script_src is not None and "unsafe-inline" not in script_src.group(1)
    # every hostile string is escaped: no script element but the page's own (two inline + the chart data)
    opened = re.findall(r"<script[^>]*>", html)
    assert all(tag in ("<script>",) or 'type="application/json"' in tag for tag in opened), opened
    assert html.count("<script>") == 2
    assert "<img src=x" not in html


def test_report_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "broken.json"
    bad.write_text('{"traceEvents": [')
    assert main(["report", str(bad), "-o", str(tmp_path / "x.html")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(bad) in err[0] and "Traceback" not in err[0]
    assert not (tmp_path / "x.html").exists()


@pytest.mark.slow
def test_monitor_writes_the_report_at_close_and_indexes_it(tmp_path: Path) -> None:
    run_dir = findings_job(tmp_path, "healthy")
    manifest = read_manifest(run_dir)
    reports = [a for a in manifest.artifacts if a.kind == "report"]
    assert [a.path for a in reports] == ["report.html"]
    assert (run_dir / "report.html").stat().st_size > 100_000


def test_report_false_writes_no_report(tmp_path: Path) -> None:
    import torch

    import stepscope

    with stepscope.performance_monitor(
        out_dir=str(tmp_path), wait=0, warmup=0, active=1, report=False, console=False
    ) as monitor:
        for _ in range(2):
            torch.ones(8).sum()
            monitor.step()
    assert not (monitor.run_dir / "report.html").exists()
    assert not [a for a in read_manifest(monitor.run_dir).artifacts if a.kind == "report"]


def test_a_failing_report_costs_one_warning_not_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    import stepscope
    from stepscope.capture.console import StepscopeWarning
    from stepscope.capture.output import report as capture_report

    monkeypatch.setattr(capture_report.sys, "executable", str(tmp_path / "no-such-python"))
    monitor = stepscope.performance_monitor(out_dir=str(tmp_path), wait=0, warmup=0, active=1, console=False)
    with pytest.warns(StepscopeWarning, match="HTML report was not written") as caught, monitor as m:
        for _ in range(2):
            torch.ones(8).sum()
            m.step()
    assert len([w for w in caught if "HTML report" in str(w.message)]) == 1
    assert (m.run_dir / "metrics.jsonl").is_file()


# ------------------------------------------------------------------------------------------------ browser
@pytest.mark.slow
def test_hostile_names_render_as_text_and_execute_nothing(tmp_path: Path) -> None:
    out = make_report(hostile_trace(tmp_path / "hostile.json"), tmp_path / "hostile.html")
    with visit(out) as seen:
        page = seen.page
        assert page.evaluate("typeof window.__pwned") == "undefined"
        assert_clean(seen)
        text = page.inner_text("body")
        for name in HOSTILE[:5]:
            assert name.strip()[:30] in text or name in page.content()
        # the names are there as text in the ops table
        assert "<script>window.__pwned=1;alert(1)</script>" in text
        screenshot(page, "hostile.png")


@pytest.mark.slow
def test_report_of_a_cpu_run_in_the_browser(tmp_path: Path) -> None:
    run_dir = findings_job(tmp_path, "loader_stall")
    out = run_dir / "report.html"
    with visit(out) as seen:
        page = seen.page
        assert_clean(seen)
        assert section_ids(page) == SECTIONS
        # the findings come first, the loader stall leads and links to the overview
        first = page.locator("li.finding").first
        assert "data_loader_stall" in first.inner_text()
        assert first.locator("a.see").get_attribute("href") == "#overview"
        # overview: the run's step times and the per-step categories, drawn
        assert page.locator("#overview div.chart svg.marks").count() == 2
        # a table sorts: calls, largest first, then smallest first
        table = page.locator("table#top-ops")
        header = table.locator("th", has_text="calls")
        header.click()
        calls = [
            float(v)
            for v in table.locator("tbody td:nth-child(2)").evaluate_all("t => t.map(c => c.dataset.v)")
        ]
        assert calls == sorted(calls, reverse=True)
        header.click()
        calls = [
            float(v)
            for v in table.locator("tbody td:nth-child(2)").evaluate_all("t => t.map(c => c.dataset.v)")
        ]
        assert calls == sorted(calls)
        # filtering hides the other rows
        page.fill("input[data-table=top-ops]", "DataLoader")
        visible = table.locator("tbody tr:visible")
        assert visible.count() >= 1
        texts = visible.all_inner_texts()
        assert all("dataloader" in t.lower() for t in texts), texts
        screenshot(page, "cpu_run.png")


@pytest.mark.slow
def test_report_of_a_two_rank_gloo_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torchrun(tmp_path, "all")
    run_dir = next(p for p in tmp_path.iterdir() if p.is_dir())
    # the report the monitor wrote may predate rank 1's trace; the command reads the folder as it is now
    out = make_report(run_dir, run_dir / "report.html")
    # the Communication chart: one bar per rank and collective, each the rank's own time, side by side (added
    # up, 4 ranks' bars ran to 600 ms for a 200 ms window)
    capsys.readouterr()
    assert main(["analyze", str(run_dir), "--json"]) == 0
    timed = {
        (f"rank {r['rank']}", c["kind"]): round(c["time_ms"], 4)
        for r in json.loads(capsys.readouterr().out)["ranks"]
        for c in r["collectives"]
    }
    (comm,) = [s for s in chart_specs(out) if s.get("encoding", {}).get("y", {}).get("field") == "collective"]
    assert {(v["rank"], v["collective"]): v["ms"] for v in comm["data"]["values"]} == timed
    assert {rank for rank, _ in timed} == {"rank 0", "rank 1"}
    assert comm["encoding"]["x"]["stack"] is None and comm["encoding"]["yOffset"]["field"] == "rank"
    with visit(out) as seen:
        page = seen.page
        assert_clean(seen)
        assert section_ids(page) == SECTIONS
        for sid in ("communication", "ranks"):
            assert page.locator(f"#{sid} p.empty").count() == 0, sid
        assert page.locator("#ranks div.chart svg.marks").count() == 2  # heatmap + per-rank bars
        assert page.locator("table#rank-steps tbody tr").count() == 2
        assert page.locator("table#collectives tbody tr").count() >= 2
        # every bar of the Communication chart starts at zero: none is stacked on another rank's
        bars = page.locator("#communication div.chart g.mark-rect path").evaluate_all(
            "ps => ps.map(p => p.getAttribute('d'))"
        )
        assert len(bars) == len(timed) and all(d.startswith("M0,") for d in bars), bars
        screenshot(page, "gloo_2ranks.png")


# The critical path's timeline: how many legend labels it has, and those drawn below its SVG (cut off)
_LEGEND_OUTSIDE = """() => {
  const svg = document.querySelector('#critical-path svg');
  if (!svg) return null;
  const bottom = svg.getBoundingClientRect().bottom;
  const labels = [...svg.querySelectorAll('.role-legend-label text')];
  return {labels: labels.length,
          outside: labels.filter(t => t.getBoundingClientRect().bottom > bottom + 1).map(t => t.textContent)};
}"""


@pytest.mark.shared
@pytest.mark.parametrize(
    "trace",
    [
        "hta_trace_filter",
        "tracelens_qwen1.5_h100_mi300/h100",
        "kineto_resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz",
    ],
)
@pytest.mark.slow
def test_report_of_real_gpu_traces(tmp_path: Path, trace: str) -> None:
    path = SHARED_TRACES / trace
    out = make_report(path, tmp_path / "gpu.html")
    assert out.stat().st_size < 5_000_000
    with visit(out) as seen:
        page = seen.page
        assert_clean(seen)
        assert section_ids(page) == SECTIONS
        assert page.locator("#gpu p.empty").count() == 0
        assert page.locator("#gpu div.chart svg.marks").count() >= 2
        assert page.locator("table#top-kernels tbody tr").count() > 5
        # a shortened kernel name expands to the full one on click
        cell = page.locator("table#top-kernels td.name[data-full]").first
        if cell.count():
            full = cell.get_attribute("data-full")
            cell.click()
            assert cell.inner_text() == full
        if "hta_trace_filter" in trace:
            assert page.locator("#ranks div.chart svg.marks").count() == 2
        # every colour of the critical path's timeline is named within the chart (its legend, beside a chart of
        # one or two rows, was cut at the chart's height: ResNet's host optimizer and other drawn, not named)
        legend = page.evaluate(_LEGEND_OUTSIDE)
        assert legend is not None and legend["labels"] >= 3 and legend["outside"] == [], legend
        screenshot(page, re.sub(r"[^a-z0-9]+", "_", trace.lower())[:40] + ".png")


@pytest.mark.shared
@pytest.mark.slow
def test_compare_page(tmp_path: Path) -> None:
    base, test = SHARED_TRACES / "hta_trace_compare" / "base", SHARED_TRACES / "hta_trace_compare" / "test"
    out = make_report(base, tmp_path / "cmp.html", "--compare", str(test))
    with visit(out) as seen:
        page = seen.page
        assert_clean(seen)
        assert section_ids(page) == ["step-time", "phases", "findings-diff", "changes"]
        assert page.locator("#phases div.chart svg.marks").count() == 1
        assert page.locator("table#kernel-deltas tbody tr").count() >= 1
        screenshot(page, "compare.png")


def test_report_json_data_cannot_close_its_script(tmp_path: Path) -> None:
    """The chart data blocks hold no raw '<' at all: no string can end them or open a comment."""
    out = make_report(hostile_trace(tmp_path / "hostile.json"), tmp_path / "r.html")
    html = out.read_text()
    for block in re.findall(r'<script type="application/json"[^>]*>(.*?)</script>', html, flags=re.S):
        assert "<" not in block and ">" not in block
        json.loads(block)


def test_report_never_replaces_what_is_not_a_regular_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = hostile_trace(tmp_path / "t.json")
    real = tmp_path / "real.html"
    real.write_text("keep me")
    link = tmp_path / "link.html"
    link.symlink_to(real)
    folder = tmp_path / "folder.html"
    folder.mkdir()
    afile = tmp_path / "afile"
    afile.write_text("x")
    for target in (link, folder, afile / "x.html"):
        assert main(["report", str(trace), "-o", str(target)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and str(target) in err[0] and "Traceback" not in err[0], err
    # THEN the symlink is still a symlink, and what it points to is untouched
    assert link.is_symlink() and real.read_text() == "keep me" and folder.is_dir()


def test_a_report_of_rank_files_is_the_same_on_workers(tmp_path: Path) -> None:
    """`report --jobs 2` analyses a folder one rank per task, each rank's summary made beside its analysis:
    the page is the one `--jobs 1` writes, and the one of the whole table loaded in this process."""
    import msgspec

    from stepscope.analysis.read.loader import load_trace
    from stepscope.report.data import collect_report

    from ..support.truth import Job, write_job

    folder = tmp_path / "ranks"
    folder.mkdir()
    write_job(Job(ranks=4, steps=6, late={1: (2000.0, 1.0)}), folder)
    pages = []
    for jobs in ("1", "2"):
        page = tmp_path / f"jobs{jobs}.html"
        assert main(["report", str(folder), "-o", str(page), "--jobs", jobs]) == 0
        pages.append(re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", "", page.read_text()))
    assert pages[0] == pages[1]
    on_workers = collect_report(folder, jobs=2)
    in_one_table = collect_report(folder, table=load_trace(folder))
    for field in ("summary", "devices", "world_sizes", "traces"):
        assert msgspec.to_builtins(getattr(on_workers, field)) == msgspec.to_builtins(
            getattr(in_one_table, field)
        )
    assert msgspec.to_builtins(on_workers.analysis.findings) == msgspec.to_builtins(
        in_one_table.analysis.findings
    )
    assert [r.rank for r in on_workers.summary.ranks] == [0, 1, 2, 3]
