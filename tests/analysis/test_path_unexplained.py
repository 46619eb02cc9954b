"""Critical-path categories that mean one thing (issue 43, item 3): a GPU activity that waits far beyond the
rank's usual launch latency, or far beyond its stream's usual gap, waited for something the trace does not show:
that time is an "unexplained wait", counted, not launch latency nor a gap between kernels."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stepscope.cli import main

from ..support.traces import cpu, launched, runtime, step, write_trace


def job(path: Path, *, queued: bool) -> Path:
    """3 steps of 2 ms: five 30 us GEMMs 10 us apart, then one GEMM that starts 1.5 ms into the step with its
    stream idle from 0.22 ms on. `queued`: every GEMM launched at the step's start, each held by its stream (10 us
    gaps), the late one after a 1.28 ms gap; else each launched 10 us before it starts, the late one 1.26 ms before.
    The host synchronizes the device at the end of each step."""
    events, corr = [], 0
    for k in range(3):
        t0 = k * 2000
        events += [step(k, t0, 2000), cpu("aten::mm", t0 + 10, 50)]
        for j in range(5):
            # (queued: all launched at once, each runs 10 us after the one before: their stream holds them)
            launch = t0 + 20 + j * (5 if queued else 40)
            events += launched("gemm_small", launch, t0 + 30 + j * 40, 30, corr := corr + 1)
        late_launch = t0 + 60 if queued else t0 + 240
        events += launched("gemm_late", late_launch, t0 + 1500, 200, corr := corr + 1)
        events.append(runtime("cudaDeviceSynchronize", t0 + 250, 1470, corr := corr + 1))
    return write_trace(path, events, 0, world_size=1)


def critical_path(capsys: pytest.CaptureFixture[str], trace: Path) -> dict[str, Any]:
    assert main(["analyze", str(trace), "--json"]) == 0
    path = json.loads(capsys.readouterr().out)["critical_path"]
    assert path is not None
    return path


@pytest.mark.parametrize("queued", [False, True])
def test_a_long_wait_the_trace_does_not_explain_is_named_so(
    queued: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = critical_path(capsys, job(tmp_path / "t.json", queued=queued))
    kinds = path["by_kind_ms"]
    # THEN the 1.2-1.3 ms the late GEMM waited is an unexplained wait, one a step; launch latency and gaps keep
    # their usual size (10 us a launch)
    assert kinds["unexplained"] == pytest.approx(1.27 if queued else 1.25, abs=0.03)
    assert path["unexplained_waits"] == 1.0
    assert kinds.get("launch", 0.0) <= 0.02 and kinds.get("gap", 0.0) <= 0.06
    # AND the terminal says what it is
    assert main(["analyze", str(tmp_path / "t.json")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "1 GPU activities a step on the path waited for what the trace does not show (unexplained wait)"
        in out
    )
    assert main(["whatif", str(tmp_path / "t.json")]) == 0
    assert "unexplained wait (not in the trace)" in " ".join(capsys.readouterr().out.split())


def test_usual_latency_is_launch_latency(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN the late GEMM launched 10 us before it starts, as the others: nothing unexplained
    events, corr = [], 0
    for k in range(3):
        t0 = k * 2000
        events += [step(k, t0, 2000), cpu("aten::mm", t0 + 10, 50)]
        for j in range(5):
            events += launched("gemm_small", t0 + 20 + j * 40, t0 + 30 + j * 40, 30, corr := corr + 1)
        events += launched("gemm_late", t0 + 1490, t0 + 1500, 200, corr := corr + 1)
        events.append(runtime("cudaDeviceSynchronize", t0 + 1495, 225, corr := corr + 1))
    path = critical_path(capsys, write_trace(tmp_path / "t.json", events, 0, world_size=1))
    assert "unexplained" not in path["by_kind_ms"] and path["unexplained_waits"] == 0.0
