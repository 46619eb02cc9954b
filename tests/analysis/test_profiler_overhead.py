"""Profiled steps much slower than the plain ones get a notice with both figures (#42 item 7): the profiler's
overhead distorts every share the trace gives."""

from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

STEPSCOPE = [sys.executable, "-m", "stepscope"]


@pytest.fixture(scope="module")
def overhead_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ..support.jobs import profiler_overhead as job

    out = tmp_path_factory.mktemp("overhead")
    subprocess.run([sys.executable, job.__file__, str(out)], check=True, timeout=240, capture_output=True)
    return next(p.parent for p in out.rglob("manifest.json"))


def _analyze(run: Path) -> dict:
    done = subprocess.run(
        [*STEPSCOPE, "analyze", str(run), "--json"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _notice(doc: dict) -> list[str]:
    return [n for n in doc["notices"] if n.startswith("profiled steps")]


@pytest.mark.slow
def test_profiled_steps_much_slower_than_plain_ones_get_a_notice(overhead_run: Path) -> None:
    # GIVEN a real job of thousands of tiny ops per step, to each of which the profiler adds its cost
    doc = _analyze(overhead_run)
    profiled = statistics.median(s["dur_us"] / 1000 for s in doc["ranks"][0]["steps"])
    (times,) = doc["run"]["step_times"]
    assert profiled >= 1.25 * times["median_ms"]  # (what the job is built to show)
    # THEN a notice gives both figures: the analysed steps' median and the plain steps'
    (notice,) = _notice(doc)
    ratio = float(re.match(r"profiled steps ([\d.]+)x the plain steps'", notice).group(1))
    assert ratio == pytest.approx(profiled / times["median_ms"], abs=0.05)
    assert f"(median of {len(doc['ranks'][0]['steps'])})" in notice
    assert f"(median of {times['plain_steps']} steps without the profiler" in notice
    assert "distorted by the profiler's overhead" in notice
    # AND the terminal prints it
    text = subprocess.run([*STEPSCOPE, "analyze", str(overhead_run)], capture_output=True, text=True).stderr
    assert "profiled steps" in " ".join(text.split())


@pytest.mark.slow
def test_plain_steps_as_slow_as_the_profiled_ones_get_no_notice(overhead_run: Path, tmp_path: Path) -> None:
    # GIVEN the same run folder, its plain steps' times in metrics.jsonl set to the profiled steps' median
    run = Path(shutil.copytree(overhead_run, tmp_path / overhead_run.name))
    profiled = statistics.median(s["dur_us"] / 1000 for s in _analyze(run)["ranks"][0]["steps"])
    metrics = run / "metrics.jsonl"
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    for line in lines:
        if line["phase"] == "none":
            line["wall_ms"] = profiled
    metrics.write_text("".join(json.dumps(line) + "\n" for line in lines))
    # THEN no notice: the profiler costs the step nothing visible
    assert _notice(_analyze(run)) == []
