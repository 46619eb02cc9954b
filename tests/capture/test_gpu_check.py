"""`make gpu-check` without CUDA: the dry mode runs every check's CPU fallback, so the script cannot rot
between the sessions that have a GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"

WHATIF = "whatif: predicted step against the re-run job"
# What the CPU can check; every other check must say "skipped: no CUDA" (none may vanish unnoticed).
CPU_CHECKS = {
    "collectors: no unexpected warning",
    "trace: one per window, ProfilerStep spans match the schedule",
    "analyze: runs on the run folder",
    "flops: bf16 autocast step counted as bf16",
    "memory log: a row every N steps",
    "memory timeline on cpu: raw + html, parsed",
    "system sampler: CPU / RSS samples",
    "run folder: every collector's artifacts indexed",
    "mfu: GEMM TFLOP/s agrees with an independent timing",
    "ops: each product's FLOPs from its recorded shapes",
    "ops: achieved TFLOP/s agrees with a timing of the same product",
    WHATIF,
    "overhead: wait phase vs bare step",
    "window end: stall vs raw torch.profiler's export",
    "overhead: active window vs raw torch.profiler",
}
GPU_CHECKS = {
    "trace: CUDA kernels on the model's device",
    "analyze: GPU busy > 0",
    "analyze: workload kernels (matmul, attention, layer norm)",
    "summary: top GPU kernels, CUDA memory lines",
    "mfu: transformer step has an MFU",
    "mfu: device name maps to a peak",
    "ops: the badly sized product ranks lower in efficiency",
    "memory log: CUDA allocated / peak columns",
    "memory snapshot: written, parsed, peak within 1% of torch's",
    "memory snapshot: OOM dumps a snapshot and re-raises",
    "system sampler: NVML util, memory, power",
    "nsight: one cudaProfilerStart/Stop per window, NVTX calls ran",
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
    # (the whatif check may say its tiny CPU jobs moved too much between rounds to judge: then it says so)
    if results[WHATIF].startswith("skipped: undecided: the unchanged job's step moved by"):
        results[WHATIF] = "pass"
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


def _gpu_check() -> Any:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return gpu_check


def test_a_failing_check_fails_the_run(tmp_path: Path) -> None:
    # GIVEN the check runner of the script
    gpu_check = _gpu_check()
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


def test_a_workload_that_raises_is_a_failed_row_and_the_rest_still_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a GEMM workload that raises, and a JSON left by an earlier run
    gpu_check = _gpu_check()

    def broken(*args: Any) -> Any:
        raise RuntimeError("cuBLAS said no")

    monkeypatch.setattr(gpu_check, "gemm_phase", broken)
    (tmp_path / "gpu_check.json").write_text('{"stale": true}')
    # WHEN the gemm and oom phases run
    status = gpu_check.main(["--dry-run", "--only", "gemm", "--only", "oom", "--out", str(tmp_path)])
    # THEN the run fails, with the workload's error as one row, the OOM phase still checked, and a fresh JSON
    assert status == 1
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [(c["check"], c["result"]) for c in doc["checks"]] == [
        ("gemm: FLOPs and TFLOP/s against an independent timing: the workload ran", "FAIL"),
        ("memory snapshot: OOM dumps a snapshot and re-raises", "skipped: no CUDA"),
    ]
    assert doc["checks"][0]["figure"] == "RuntimeError: cuBLAS said no"
    assert "| FAIL | RuntimeError: cuBLAS said no |" in capsys.readouterr().out


def test_require_cuda_without_cuda_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gpu_check = _gpu_check()
    if gpu_check.torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert gpu_check.main(["--require-cuda", "--out", str(tmp_path)]) == 2
    assert "--require-cuda" in capsys.readouterr().err
