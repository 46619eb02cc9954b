"""The HTML report's size, first paint and generation time, on the largest trace in ../shared/traces.

    .venv/bin/python benchmarks/report_bench.py [--rounds 7] [--trace PATH]

- generation: `stepscope analyze TRACE` and `stepscope report TRACE -o PAGE`, each a fresh process, alternating
  round by round (the order flipping each round), after one warm-up round of each; the medians and the median of
  the paired ratios report / analyze (target: <= 1.25);
- size of the page (target: <= 5 MB);
- first paint in headless Chromium (Debian's /usr/bin/chromium, the flags of tests/support/browser.py, a fresh
  profile per load), read from the page's own paint timings, and the time until every chart is drawn; the
  median of `--loads` loads (target: first paint <= 2 s).
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _results import write_result

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"
STEPSCOPE = [sys.executable, "-m", "stepscope"]


def json_size(path: Path) -> int:
    if path.name.endswith(".gz"):
        with gzip.open(path, "rb") as fh:
            return sum(len(chunk) for chunk in iter(lambda: fh.read(1 << 20), b""))
    return path.stat().st_size


def largest_trace() -> Path:
    files = [
        p for p in SHARED.rglob("*.json*") if (p.is_file() and "trace" in p.name.lower()) or p.suffix == ".gz"
    ]
    best = max(files, key=json_size)
    return best


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def paint(page: Path, loads: int) -> tuple[list[float], list[float]]:
    sys.path.insert(0, str(ROOT))
    from playwright.sync_api import sync_playwright
    from tests.support.browser import CHROMIUM_ARGS, chromium_path

    firsts, charts = [], []
    exe = chromium_path()
    if exe is None:
        raise SystemExit("no chromium: apt-get install -y chromium")
    with sync_playwright() as p:
        for _ in range(loads):
            with tempfile.TemporaryDirectory() as profile:
                ctx = p.chromium.launch_persistent_context(
                    profile,
                    executable_path=exe,
                    args=CHROMIUM_ARGS,
                    headless=True,
                    viewport={"width": 1300, "height": 900},
                )
                pg = ctx.new_page()
                pg.goto(page.resolve().as_uri())
                pg.wait_for_function(
                    "document.querySelectorAll('div.chart').length === "
                    "document.querySelectorAll('div.chart svg.marks').length",
                    timeout=30_000,
                )
                done = pg.evaluate("performance.now()")
                fcp = pg.evaluate(
                    "(performance.getEntriesByType('paint').find(e => e.name === 'first-contentful-paint') "
                    "|| performance.getEntriesByType('paint')[0] || {startTime: null}).startTime"
                )
                if fcp is None:
                    raise SystemExit("the page recorded no paint timing")
                firsts.append(fcp / 1000)
                charts.append(done / 1000)
                ctx.close()
    return firsts, charts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--loads", type=int, default=5)
    args = ap.parse_args()
    trace = args.trace or largest_trace()
    out = Path(tempfile.mkdtemp(prefix="stepscope-report-bench-")) / "page.html"
    analyze = [*STEPSCOPE, "analyze", str(trace)]
    report = [*STEPSCOPE, "report", str(trace), "-o", str(out)]
    timed(analyze), timed(report)  # warm-up: page cache, the cached Vega bundle
    a_times, r_times, ratios = [], [], []
    for i in range(args.rounds):
        if i % 2 == 0:
            a, r = timed(analyze), timed(report)
        else:
            r, a = timed(report), timed(analyze)
        a_times.append(a)
        r_times.append(r)
        ratios.append(r / a)
    size = out.stat().st_size
    firsts, charts = paint(out, args.loads)
    rows = [
        ("trace", f"{trace.name} ({json_size(trace) / 1e6:.1f} MB of JSON)", "-"),
        ("page size", f"{size / 1e6:.2f} MB", "<= 5 MB"),
        ("analyze, median", f"{statistics.median(a_times):.3f} s", "-"),
        ("report, median", f"{statistics.median(r_times):.3f} s", "-"),
        (
            "report / analyze, paired",
            f"median {statistics.median(ratios):.3f} (rounds {min(ratios):.3f}-{max(ratios):.3f})",
            "<= 1.25",
        ),
        (
            "first contentful paint",
            f"median {statistics.median(firsts):.3f} s (loads {min(firsts):.3f}-{max(firsts):.3f})",
            "<= 2 s",
        ),
        ("every chart drawn", f"median {statistics.median(charts):.3f} s", "-"),
    ]
    for what, figure, target in rows:
        print(f"{what}: {figure}" + (f" (target {target})" if target != "-" else ""))
    write_result(
        "report_bench",
        "The HTML report's size, generation time and first paint",
        ("measure", "figure", "target"),
        rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
