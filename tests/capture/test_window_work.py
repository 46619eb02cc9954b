"""A window's end work (the child that gzips its trace and writes its summary) yields to training: it runs at the
lowest priority, one at a time per machine, and the manifest says which steps ran while it used the CPU, so that
the plain-step statistics (analyze's step times, diff) leave them out and say how many."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from stepscope.capture.window import child
from stepscope.cli import cli

from ..support.train import profiled_run

STEPS = 30


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CPU run of two windows (steps 3-4 and 8-9) and plain steps around them."""
    return profiled_run(
        tmp_path_factory.mktemp("runs"), STEPS, wait=2, warmup=1, active=2, repeat=2, console=False
    )


def manifest_of(path: Path) -> dict[str, Any]:
    return json.loads((path / "manifest.json").read_text())  # type: ignore[no-any-return]


def analyze_json(*args: str) -> dict[str, Any]:
    result = CliRunner().invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)  # type: ignore[no-any-return]


def with_beside(run: Path, tmp_path: Path, beside: dict[int, list[list[int]]]) -> Path:
    """A copy of `run` whose trace entries say their window's work ran beside the given steps."""
    copy = tmp_path / run.name
    shutil.copytree(run, copy)
    doc = manifest_of(copy)
    for artifact in doc["artifacts"]:
        if artifact["kind"] == "trace":
            artifact["beside_steps"] = beside[artifact["step"]]
    (copy / "manifest.json").write_text(json.dumps(doc))
    return copy


def test_each_trace_says_which_steps_ran_beside_its_work(run_dir: Path) -> None:
    traces = [a for a in manifest_of(run_dir)["artifacts"] if a["kind"] == "trace"]
    assert [a["step"] for a in traces] == [4, 9]
    for a in traces:
        # the work starts after the window's last step and is done by the job's end (close waits for it); the
        # worker's own part, after the child, marks at least the step it ended in
        ranges = a["beside_steps"]
        assert ranges and all(a["step"] < first <= last <= STEPS for first, last in ranges)
        assert all(b[0] > a_[1] + 1 for a_, b in itertools.pairwise(ranges))  # merged, in order


def test_plain_steps_leave_out_those_beside_a_windows_work(run_dir: Path, tmp_path: Path) -> None:
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    plain = [m["step"] for m in metrics if m["phase"] == "none" and m["step"] > 0]
    # window 1's work ran beside steps 5-6, window 2's beside 10 and 12
    copy = with_beside(run_dir, tmp_path, {4: [[5, 6]], 9: [[10, 10], [12, 12]]})
    (times,) = analyze_json("analyze", str(copy))["run"]["step_times"]
    left_out = [s for s in plain if s in (5, 6, 10, 12)]
    assert times["overlapped_steps"] == len(left_out) == 4
    assert times["plain_steps"] == len(plain) - len(left_out)
    kept = [m["wall_ms"] for m in metrics if m["step"] in set(plain) - set(left_out)]
    assert times["median_ms"] == pytest.approx(statistics.median(kept))
    assert "4 steps that ran beside a window's end work" in times["overlap_note"]
    # the terminal says it under the step table
    out = CliRunner().invoke(cli, ["analyze", str(copy)]).output
    assert "4 steps that ran beside a window's end work" in " ".join(out.split())
    # diff's plain steps leave out the same steps
    base = analyze_json("diff", str(copy), str(copy))["step_time"]["base"]
    assert base["source"] == "plain"
    assert set(base["steps"]) == set(plain) - set(left_out)


def test_too_few_left_keeps_them_and_says_so(run_dir: Path, tmp_path: Path) -> None:
    # each window's work ran to the job's end: no plain step after the first window would be left
    copy = with_beside(run_dir, tmp_path, {4: [[5, STEPS]], 9: [[10, 10**12]]})
    (times,) = analyze_json("analyze", str(copy))["run"]["step_times"]
    assert times["overlapped_steps"] == 0
    assert "counted, since too few would remain" in times["overlap_note"]


def test_the_child_runs_at_the_lowest_priority(monkeypatch: pytest.MonkeyPatch) -> None:
    # a child that answers each job with its scheduling policy and niceness
    probe = (
        "import json, os, sys\n"
        "for line in sys.stdin:\n"
        "    answer = [os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0)]\n"
        "    print(json.dumps({'status': 0, 'result': answer}), flush=True)\n"
    )
    monkeypatch.setattr(child, "CHILD_COMMAND", (sys.executable, "-c", probe))
    worker_child = child.Child()
    try:
        status, (policy, nice), _ = worker_child.run(b"{}", child.StepTrail(lambda: 0))
        # kept for the next job: the same process answers
        pid = worker_child._proc.pid if worker_child._proc else None
        worker_child.run(b"{}", child.StepTrail(lambda: 0))
        assert worker_child._proc is not None and worker_child._proc.pid == pid
    finally:
        worker_child.close()
    assert status == 0
    if hasattr(os, "SCHED_IDLE"):
        assert policy == os.SCHED_IDLE
    assert nice == child.LOWEST_NICE


def test_a_child_that_dies_is_said_and_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        child,
        "CHILD_COMMAND",
        (sys.executable, "-c", "import sys; sys.stderr.write('out of luck\\n'); sys.exit(3)"),
    )
    worker_child = child.Child()
    try:
        assert worker_child.run(b"{}", child.StepTrail(lambda: 0)) == (3, None, "out of luck")
        assert worker_child.run(b"{}", child.StepTrail(lambda: 0)) == (3, None, "out of luck")
    finally:
        worker_child.close()


def test_children_take_their_turn_one_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two children of one machine: the second starts its work only once the first has finished its own."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # (the lock file goes under the temp folder)
    script = (
        "import sys, time\n"
        "from stepscope.capture.window.child import node_turn\n"
        "with node_turn():\n"
        "    start = time.monotonic(); time.sleep(0.4); end = time.monotonic()\n"
        "print(start, end)\n"
    )
    children = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE) for _ in range(2)]
    spans = sorted(tuple(map(float, c.communicate(timeout=60)[0].split())) for c in children)
    assert spans[1][0] >= spans[0][1]
    assert list(tmp_path.glob("stepscope-window-end-*.lock"))


def test_the_trail_marks_the_steps_where_the_child_used_the_cpu() -> None:
    step = [10]
    trail = child.StepTrail(lambda: step[0])
    for now, cpu in ((10, 0.0), (12, 0.0), (15, 0.001), (17, 0.05), (18, 0.06), (21, 0.2), (30, 0.2)):
        step[0] = now
        trail.poll(cpu)
    # (the first poll is the baseline) 15 -> 17 used 49 ms, 18 -> 21 used 140 ms: those steps, merged;
    # 10 -> 15 and 21 -> 30 barely any
    assert trail.ranges == [(15, 21)]
    step[0] = 31
    trail.poll(None)  # CPU time unknown (the child has exited): counted as busy
    trail.now()
    assert trail.ranges[-1] == (30, 31)


def test_the_child_keeps_no_decoded_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a window's temp file is read once: nothing goes to the cache of decoded tables
    monkeypatch.setenv("STEPSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("STEPSCOPE_NO_CACHE", raising=False)
    run = profiled_run(
        tmp_path / "runs", 4, wait=0, warmup=1, active=2, repeat=1, console=False, report=False
    )
    assert [a for a in manifest_of(run)["artifacts"] if a["kind"] == "trace"]
    assert not list((tmp_path / "cache").rglob("*.table"))
