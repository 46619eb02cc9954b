from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from stepscope.cli import main
from stepscope.runfolder import read_manifest


@pytest.mark.slow
def test_demo_profiles_and_prints_the_run_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # WHEN the demo runs for 12 steps (wait 5, warmup 2, active 3: one complete window, ending at step 9)
    assert main(["demo", "--out-dir", str(tmp_path), "--steps", "12"]) == 0
    out, err = capsys.readouterr()
    # THEN it printed the top-ops table (on stderr, as the monitor always does) and the run folder, which holds
    # one trace of the window
    assert "top ops, rank 0, window ending at step 9" in err and "aten::" in err
    run_dirs = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert len(run_dirs) == 1 and f"Run folder: {run_dirs[0]}" in out
    manifest = read_manifest(run_dirs[0])
    traces = [a for a in manifest.artifacts if a.kind == "trace"]
    assert [(a.rank, a.step) for a in traces] == [(0, 9)]
    with gzip.open(run_dirs[0] / traces[0].path, "rt") as fh:
        names = {e.get("name") for e in json.load(fh)["traceEvents"]}
    assert {"forward", "backward", "optimizer", "ProfilerStep#7", "ProfilerStep#9"} <= names
    # and the report, written at close, indexed, and printed
    report = run_dirs[0] / "report.html"
    assert f"report:    {report}" in out
    assert [a.path for a in manifest.artifacts if a.kind == "report"] == ["report.html"]
    # which opens in a browser with no console error and no request leaving the file
    from ..support.browser import visit

    with visit(report) as seen:
        assert not seen.console_errors and not seen.remote_requests
        assert seen.page.locator("div.chart svg.marks").count() >= 2


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "demo" in out and "Profile the bundled CPU demo" in out


def test_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["frobnicate"]) == 2
    assert "No such command" in capsys.readouterr().err


@pytest.mark.slow
def test_the_next_command_works_as_printed(tmp_path: Path) -> None:
    # GIVEN the demo run as `make demo` runs it: the venv's script, with stepscope not on PATH
    import os
    import subprocess
    import sys

    script = Path(sys.executable).parent / "stepscope"
    if not script.exists():
        pytest.skip("no stepscope script beside this interpreter")
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [str(script), "demo", "--out-dir", str(tmp_path / "runs"), "--steps", "12"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    (line,) = [x for x in done.stdout.splitlines() if x.strip().startswith("next:")]
    command = line.split("next:", 1)[1].strip()
    # THEN the printed command runs, from the same folder, as printed
    again = subprocess.run(
        command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 0, (command, again.stderr)
    assert "Steps" in again.stdout
