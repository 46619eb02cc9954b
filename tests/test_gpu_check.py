"""`make gpu-check` without CUDA: the dry mode runs every check's CPU fallback, so the script cannot rot
between the sessions that have a GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"

# What the CPU can check; every other check must say "skipped: no CUDA" (none may vanish unnoticed).
CPU_CHECKS = {
    "collectors: none switched off",
    "trace: one per window, ProfilerStep spans match the schedule",
    "analyze: runs on the run folder",
    "flops: bf16 autocast step counted as bf16",
    "memory log: a row every N steps",
    "memory timeline on cpu: raw + html, parsed",
    "system sampler: CPU / RSS samples",
    "run folder: every collector's artifacts indexed",
    "mfu: GEMM TFLOP/s agrees with an independent timing",
    "overhead: wait phase vs bare step",
    "overhead: active window vs raw torch.profiler",
}
GPU_CHECKS = {
    "trace: CUDA kernels on the model's device",
    "analyze: GPU busy > 0",
    "analyze: workload kernels (matmul, attention, layer norm)",
    "summary: sorted by self device time, CUDA memory lines",
    "mfu: transformer step has an MFU",
    "mfu: device name maps to a peak",
    "memory log: CUDA allocated / peak columns",
    "memory snapshot: written, parsed, peak within 1% of torch's",
    "memory snapshot: OOM dumps a snapshot and re-raises",
    "system sampler: NVML util, memory, power",
    "nsight: cudaProfilerStart/Stop + NVTX around windows",
    "nsight: nsys capture holds the window's NVTX ranges",
    "report: renders the GPU sections",
}


@pytest.mark.slow
def test_dry_mode_runs_every_cpu_fallback(tmp_path: Path) -> None:
    # GIVEN a machine without CUDA (or --dry-run on one with it)
    out = tmp_path / "out"
    # WHEN the GPU check runs
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    # THEN it succeeds: each CPU fallback passed, each GPU check is reported as skipped
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    doc = json.loads((out / "gpu_check.json").read_text())
    assert doc["schema"] == "stepscope.gpu_check/1"
    assert doc["environment"]["mode"] == "dry (no CUDA)" and doc["environment"]["torch"]
    results = {c["check"]: c["result"] for c in doc["checks"]}
    assert set(results) == CPU_CHECKS | GPU_CHECKS
    assert {name: results[name] for name in CPU_CHECKS} == dict.fromkeys(CPU_CHECKS, "pass")
    assert {name: results[name] for name in GPU_CHECKS} == dict.fromkeys(GPU_CHECKS, "skipped: no CUDA")
    # AND the printed table holds the same rows, with the figures of the checks that ran
    for check in doc["checks"]:
        assert f"| {check['check']} | {check['result']} |" in done.stdout
    gemm = next(c for c in doc["checks"] if c["check"].startswith("mfu: GEMM"))
    assert "FLOPs counted exactly" in gemm["figure"]
    rounds = doc["overhead_ms_per_step"]
    assert len(rounds) == 2 and all(
        set(r) >= {"bare", "monitor, wait phase", "monitor, active window"} for r in rounds
    )


def test_a_failing_check_fails_the_run(tmp_path: Path) -> None:
    # GIVEN the check runner of the script
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(SCRIPT.parent))
    checks = gpu_check.Checks(cuda=False)

    def broken() -> tuple[bool, str]:
        raise KeyError("gpu0_util_percent")

    def not_here() -> tuple[bool, str]:
        raise gpu_check.Skip("nsys not found")

    # WHEN checks fail, raise, cannot run here, or need CUDA
    checks.run("false", lambda: (False, "3% off"))
    checks.run("raises", broken)
    checks.run("skip", not_here)
    checks.run("needs cuda", lambda: (True, ""), gpu=True)
    # THEN each is reported as such, and the run fails
    assert [(c.result, c.figure) for c in checks.rows] == [
        ("FAIL", "3% off"),
        ("FAIL", "KeyError: 'gpu0_util_percent'"),
        ("skipped: nsys not found", ""),
        ("skipped: no CUDA", ""),
    ]
    assert len(checks.failed) == 2
