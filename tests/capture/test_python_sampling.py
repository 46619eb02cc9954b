"""Python sampling with py-spy (python_sampling=True) on real jobs: the folded stacks in the run folder, the
function `analyze --json` names, the report's flame graph; and the job going on where py-spy cannot run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from stepscope.capture.collectors.pysampling import find_py_spy, parse_folded
from stepscope.cli import main
from stepscope.runfolder import read_manifest
from stepscope.runfolder.payloads import PYTHON_SAMPLES_SCHEMA, PythonSamples

from ..support.jobs import run_ranks
from ..support.output import chart_specs

JOB = Path(__file__).parents[1] / "support" / "jobs" / "sampling.py"
HOT_LINE = next(i for i, line in enumerate(JOB.read_text().splitlines(), 1) if "def python_hot_loop" in line)


def py_spy_problem() -> str | None:
    """Why py-spy cannot sample its parent process here (None: it can), as the collector runs it."""
    exe = find_py_spy()
    if exe is None:
        return "py-spy is not installed (pip install 'stepscope[pyspy]')"
    child = subprocess.run(
        [exe, "dump", "--pid", str(os.getpid())], capture_output=True, text=True, timeout=60
    )
    if child.returncode != 0:
        return f"py-spy cannot attach here (ptrace not permitted?): {(child.stdout + child.stderr)[-300:]}"
    return None


def run_job(tmp_path: Path, mode: str, ranks: int, env: dict[str, str] | None = None) -> tuple[Path, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(JOB.parents[3]), **(env or {}))
    cmd = [sys.executable, str(JOB)]
    if ranks > 1:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            str(ranks),
            str(JOB),
        ]
    result = run_ranks([*cmd, str(tmp_path / "runs"), mode], tmp_path, text=True, env=env, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    return run_dir, result.stderr


def analyze_json(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    capsys.readouterr()
    assert main(["analyze", str(run_dir), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_py_spy_names_the_function_that_holds_the_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a 2-rank gloo job whose steps spend most of their time in a pure-Python loop, with python_sampling
    problem = py_spy_problem()
    if problem:
        pytest.skip(problem)
    run_dir, _ = run_job(tmp_path, "python", ranks=2)

    # THEN each rank wrote the window's folded stacks, a typed kind indexed in the manifest
    entries = [a for a in read_manifest(run_dir).artifacts if a.kind == "python_samples"]
    assert sorted(a.rank for a in entries) == [0, 1]
    for entry in entries:
        assert (
            entry.schema == PYTHON_SAMPLES_SCHEMA
            and entry.path == f"python_samples/rank{entry.rank}_step5.json"
        )
        samples = msgspec.json.decode((run_dir / entry.path).read_bytes(), type=PythonSamples)
        assert (samples.first_step, samples.last_step, samples.rate_hz) == (1, 5, 100)
        assert (
            samples.training_thread is not None and "MainThread" in samples.threads[samples.training_thread]
        )
        assert samples.sampled_s > 0.05 and sum(s.count for s in samples.stacks) >= 5

    # WHEN the run is analysed
    doc = analyze_json(run_dir, capsys)

    # THEN run.python_samples ranks the hot loop first, by self time, with its file and first line
    profiles = doc["run"]["python_samples"]
    assert sorted(p["rank"] for p in profiles) == [0, 1]
    for p in profiles:
        top = p["functions"][0]
        assert (top["function"], top["file"], top["line"]) == ("python_hot_loop", str(JOB), HOT_LINE)
        # (first by self time; its share of the samples moves with the 2 cores' load: 40.9% on one fresh-clone CI
        # run, the rest in the monitor's own window end, torch and gloo)
        assert top["self_pct"] >= 33 and top["inclusive_pct"] >= top["self_pct"]
        assert top["where"] == f"jobs/sampling.py:{HOT_LINE}"
    # and a finding names it on every rank, priced by its self share of the step: one finding for both ranks when
    # their costs agree, one per rank when the 2 cores' load parts them (seen once on a fresh-clone CI run)
    hots = [f for f in doc["findings"] if f["id"] == "python_hotspot"]
    assert sorted(r for hot in hots for r in hot["ranks"]) == [0, 1] and len(hots) <= 2
    for hot in hots:
        assert f"`python_hot_loop` (jobs/sampling.py:{HOT_LINE})" in hot["message"]
        assert hot["evidence"]["function"] == "python_hot_loop" and hot["evidence"]["line"] == HOT_LINE
        assert hot["cost_ms_per_step"] > 0 and hot["pct_of_step"] >= 33
    # the host-side finding (time with no torch op) names it in its evidence too
    (overhead,) = [f for f in doc["findings"] if f["id"] == "python_overhead"]
    assert overhead["evidence"]["python_function"] == "python_hot_loop"
    assert "py-spy: the rank's Python time is mostly in `python_hot_loop`" in overhead["message"]

    # WHEN the report is written THEN it draws the window's samples as a flame graph (Vega-Lite rects)
    out = tmp_path / "report.html"
    assert main(["report", str(run_dir), "-o", str(out)]) == 0
    flames = [
        s
        for s in chart_specs(out)
        if s.get("layer")
        and s["layer"][0]["mark"]["type"] == "rect"
        and s["layer"][0]["encoding"].get("x2", {}).get("field") == "end"
    ]
    assert len(flames) == 2  # one per rank
    boxes = flames[0]["data"]["values"]
    hot_boxes = [b for b in boxes if b["function"] == "python_hot_loop"]
    assert hot_boxes and hot_boxes[0]["where"] == f"jobs/sampling.py:{HOT_LINE}" and hot_boxes[0]["pct"] >= 50
    assert min(b["depth"] for b in boxes) == 0 and boxes[0]["function"] == "<module>"
    assert "Python and host memory" in out.read_text()


def test_without_ptrace_one_warning_names_the_fix_and_the_job_goes_on(tmp_path: Path) -> None:
    # GIVEN a py-spy that cannot attach (as where ptrace is not permitted): it says so and exits 1
    fake = tmp_path / "py-spy"
    fake.write_text("#!/bin/sh\necho 'Error: Permission Denied (os error 13)' >&2\nexit 1\n")
    fake.chmod(0o755)
    run_dir, stderr = run_job(tmp_path, "python", ranks=1, env={"STEPSCOPE_PY_SPY": str(fake)})
    # THEN one warning names the fix, no samples are written, and the job's traces and steps are all there
    warnings = [line for line in stderr.splitlines() if "py-spy could not sample" in line]
    assert len(warnings) == 1, stderr[-2000:]
    assert (
        "Permission Denied" in warnings[0] and "SYS_PTRACE" in warnings[0] and "ptrace_scope" in warnings[0]
    )
    kinds = {a.kind for a in read_manifest(run_dir).artifacts}
    assert "python_samples" not in kinds and "trace" in kinds
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 7


def test_without_py_spy_one_warning_says_how_to_install_it(tmp_path: Path) -> None:
    run_dir, stderr = run_job(tmp_path, "python", ranks=1, env={"STEPSCOPE_PY_SPY": str(tmp_path / "absent")})
    warnings = [line for line in stderr.splitlines() if "py-spy is not installed" in line]
    assert len(warnings) == 1 and "stepscope[pyspy]" in warnings[0]
    assert "trace" in {a.kind for a in read_manifest(run_dir).artifacts}


def test_folded_stacks_parse_into_frames_threads_and_counts() -> None:
    text = (
        "thread (7): MainThread;<module> (/a/job.py:1);step (/a/job.py:9);hot (/a/job.py:3) 40\n"
        "thread (7): MainThread;<module> (/a/job.py:1);step (/a/job.py:9) 5\n"
        "thread (8): loader;run (/usr/lib/python3/threading.py:975) 2\n"
        "garbage line\n"
    )
    samples = parse_folded(text, training_thread=7)
    assert samples.threads == ["7 MainThread", "8 loader"] and samples.training_thread == 0
    assert [(f.function, f.file, f.line) for f in samples.frames][:3] == [
        ("<module>", "/a/job.py", 1),
        ("step", "/a/job.py", 9),
        ("hot", "/a/job.py", 3),
    ]
    assert sorted((s.thread, len(s.frames), s.count) for s in samples.stacks) == [
        (0, 2, 5),
        (0, 3, 40),
        (1, 1, 2),
    ]


def test_a_py_spy_that_ignores_sigint_is_killed_after_a_bounded_wait(tmp_path: Path) -> None:
    # GIVEN a py-spy that starts sampling, then ignores SIGINT and never ends (it writes its pid to a file)
    import time

    pids = tmp_path / "pids"
    fake = tmp_path / "py-spy"
    fake.write_text(
        "#!/bin/sh\n"
        "trap '' INT\n"
        f"echo $$ >> {pids}\n"
        "echo 'py-spy> Sampling process 100 times a second. Press Control-C to exit.'\n"
        "while true; do sleep 0.2; done\n"
    )
    fake.chmod(0o755)
    # WHEN a job with python_sampling runs its window and ends
    started = time.monotonic()
    run_dir, stderr = run_job(tmp_path, "python", ranks=1, env={"STEPSCOPE_PY_SPY": str(fake)})
    took = time.monotonic() - started
    # THEN it ended within the bound (a 35 s wait per window before), said so once, and left no py-spy running
    warned = [line for line in stderr.splitlines() if "py-spy did not stop" in line]
    assert len(warned) == 1 and "killed" in warned[0], stderr[-2000:]
    assert took < 30, took
    for pid in map(int, pids.read_text().split()):
        alive = (
            Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
        )
        assert not alive, f"py-spy {pid} outlived the job"
    kinds = {a.kind for a in read_manifest(run_dir).artifacts}
    assert "trace" in kinds and "python_samples" not in kinds
