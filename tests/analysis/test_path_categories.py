"""The critical path's categories mean one thing (#43 item 3): no GPU category on a rank without GPU activity.

A CPU backend (gloo) runs a collective on its own thread some time after the host called the op that issued it;
that wait is the backend's dispatch, not a kernel's launch latency."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ..support.traces import cpu, launched, step, write_trace

STEPSCOPE = [sys.executable, "-m", "stepscope"]
T0 = 1_000_000.0
GPU_KINDS = {"computation", "memory", "launch", "gap"}
SHAPED = {"Input Dims": [[1000]], "Input type": ["float"]}


def gloo_rank(dispatch_us: float) -> list[dict]:
    """Four 1000 us steps: 90 us of compute, an all-reduce issued at 100 us that gloo's thread starts
    `dispatch_us` later and runs for 200 us while the host waits, then 80 us of compute."""
    ev: list[dict] = []
    for i in range(4):
        t = T0 + 1000 * i
        ev += [
            step(i + 1, t, 1000),
            cpu("aten::mm", t + 10, 80),
            cpu("c10d::allreduce_", t + 100, 5),
            cpu("gloo:all_reduce", t + 100 + dispatch_us, 200, cat="user_annotation", tid=2, **SHAPED),
            cpu("aten::mm", t + 100 + dispatch_us + 210, 80),
        ]
    return ev


def gloo_job(tmp_path: Path, dispatch_us: float = 300) -> Path:
    for rank in (0, 1):
        write_trace(tmp_path / "traces" / f"rank{rank}.json", gloo_rank(dispatch_us), rank)
    return tmp_path / "traces"


def run_json(*args: str) -> dict:
    done = subprocess.run([*STEPSCOPE, *args, "--json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_cpu_only_job_has_no_gpu_category_on_its_critical_path(tmp_path: Path) -> None:
    # GIVEN two gloo ranks whose all-reduce starts on gloo's thread 300 us after the host issued it
    traces = gloo_job(tmp_path)
    # WHEN analyze and whatif give the critical path
    path = run_json("analyze", str(traces))["critical_path"]
    steps = run_json("whatif", str(traces))["critical_path"]
    # THEN no GPU kind is on it: the 300 us are the backend's dispatch, the 200 us its communication
    assert GPU_KINDS.isdisjoint(path["by_kind_ms"])
    assert path["by_kind_ms"]["dispatch"] == pytest.approx(0.3)
    assert path["by_kind_ms"]["communication"] == pytest.approx(0.2)
    assert {s["what"] for s in path["segments"]}.isdisjoint(GPU_KINDS)
    assert {s["what"] for s in path["timeline"]["path"]}.isdisjoint(GPU_KINDS)
    assert steps and all(GPU_KINDS.isdisjoint(s["by_kind_ms"]) for s in steps)
    # AND the terminal names it so, never "launch latency"
    text = subprocess.run([*STEPSCOPE, "whatif", str(traces)], capture_output=True, text=True).stdout
    flat = " ".join(text.split())
    assert "launch" not in flat and "GPU" not in flat
    assert "collective dispatch (CPU backend)" in flat or "dispatch 300 us" in flat


def test_a_kernel_started_after_its_launch_is_launch_latency(tmp_path: Path) -> None:
    # GIVEN a GPU step whose one kernel starts 51 us after its launch call starts, the stream idle
    events = [step(1, 0, 1000), *launched("gemm", 10, 61, 800, corr=1)]
    events.append(cpu("cudaDeviceSynchronize", 20, 850, cat="cuda_runtime", correlation=2))
    path = write_trace(tmp_path / "gpu.json", events)
    (rank,) = run_json("whatif", str(path))["ranks"]
    (first,) = rank["critical_path"]
    # THEN its wait is launch latency, and no dispatch
    assert first["by_kind_ms"]["launch"] == pytest.approx(0.051)
    assert "dispatch" not in first["by_kind_ms"]
