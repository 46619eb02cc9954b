"""Host memory with tracemalloc (host_memory=True) on a real job that keeps a buffer each step: the typed kind in
the run folder, the growing site `analyze --json` names, and the report's table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from stepscope.capture.collectors.hostmem import function_at
from stepscope.cli import main
from stepscope.runfolder import read_manifest
from stepscope.runfolder.payloads import HOST_MEMORY_SCHEMA, HostMemory

JOB = Path(__file__).parents[1] / "support" / "jobs" / "sampling.py"
LEAK_LINE = next(i for i, line in enumerate(JOB.read_text().splitlines(), 1) if "HISTORY.append(" in line)
LEAK_BYTES = 256 * 1024


def test_analyze_names_the_site_that_grows_each_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a job that appends a 256 KiB buffer to a module-level list every step, host_memory over 2 windows
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(JOB.parents[3]))
    result = subprocess.run(
        [sys.executable, str(JOB), str(tmp_path / "runs"), "leak"],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()

    # THEN each window wrote its sites, a typed kind in the manifest, with the leak's site by growth
    entries = sorted(
        (a for a in read_manifest(run_dir).artifacts if a.kind == "host_memory"), key=lambda a: a.step
    )
    assert [a.step for a in entries] == [4, 9] and all(a.schema == HOST_MEMORY_SCHEMA for a in entries)
    for entry in entries:
        record = msgspec.json.decode((run_dir / entry.path).read_bytes(), type=HostMemory)
        assert (record.last_step - record.first_step, record.first_step - record.start_step) == (2, 1)
        leak = next(s for s in record.sites if s.line == LEAK_LINE)
        assert leak.function == "keep_history" and leak.file == str(JOB)
        assert leak.growth_bytes >= 3 * LEAK_BYTES and leak.size_bytes >= 4 * LEAK_BYTES  # warmup + 3 active
        assert record.snapshot_ms >= 0 and record.traced_bytes >= leak.size_bytes

    # WHEN analysed THEN run.host_memory lists the site as growing, and a finding names it with its growth per step
    capsys.readouterr()
    assert main(["analyze", str(run_dir), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (facts,) = doc["run"]["host_memory"]
    top = facts["growing"][0]
    assert (top["function"], top["line"], top["windows_grown"], top["windows"]) == (
        "keep_history",
        LEAK_LINE,
        2,
        2,
    )
    assert LEAK_BYTES <= top["growth_bytes_per_step"] <= 1.2 * LEAK_BYTES
    (finding,) = [f for f in doc["findings"] if f["id"] == "host_memory_growth"]
    assert f"`keep_history` (jobs/sampling.py:{LEAK_LINE})" in finding["message"]
    assert "per step in each of its windows" in finding["message"]
    assert finding["evidence"]["growth_bytes_per_step"] == top["growth_bytes_per_step"]

    # and the report's host section has the site in its table
    out = tmp_path / "report.html"
    assert main(["report", str(run_dir), "-o", str(out)]) == 0
    html = out.read_text()
    assert "host-memory-0" in html and f"jobs/sampling.py:{LEAK_LINE}" in html


def test_a_site_is_named_by_the_function_around_its_line(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "x = 1\nclass A:\n    def f(self):\n        def g():\n            return [0]\n        return g\n"
    )
    assert function_at(str(source), 1) == "<module>"
    assert function_at(str(source), 3) == "A.f"
    assert function_at(str(source), 5) == "A.f.<locals>.g"
    assert function_at(str(tmp_path / "missing.py"), 3) == "?"
