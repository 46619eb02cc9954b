"""The findings bench: each case (a CPU job of tests/support/jobs/findings.py, or a real GPU trace of ../shared/traces)
with the finding it must lead with and the HIGH findings that are expected of it. Any other HIGH finding is a false
alarm. Used by tests/analysis/test_findings_bench.py and benchmarks/findings_bench.py (which writes the table of
docs/analysis.md)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

JOBS_SCRIPT = Path(__file__).resolve().parent / "jobs" / "findings.py"
SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces"


@dataclass(frozen=True)
class Case:
    name: str
    source: str  # "job" (tests/support/jobs/findings.py) or "trace" (a path under ../shared/traces)
    what: str  # the problem in it, in a few words
    top: str  # the id of the first finding
    high: frozenset[str] = frozenset()  # ids that may be HIGH; every other HIGH is unexpected

    def path(self, jobs_dir: Path) -> Path:
        if self.source == "job":
            (run,) = (jobs_dir / self.name).iterdir()
            return run
        return SHARED / self.name


CASES = [
    Case("healthy", "job", "healthy MLP training on CPU", "step_breakdown"),
    Case(
        "loader_stall",
        "job",
        "DataLoader sleeping in the main process",
        "data_loader_stall",
        frozenset({"data_loader_stall"}),
    ),
    Case(
        "heavy_optimizer",
        "job",
        "an SVD per weight in the optimizer",
        "optimizer_bound",
        frozenset({"optimizer_bound"}),
    ),
    Case(
        "sync_python",
        "job",
        ".item() plus 20 ms of Python per step",
        "python_overhead",
        frozenset({"python_overhead"}),
    ),
    Case(
        "tiny_ops",
        "job",
        "3000 elementwise ops on tiny tensors",
        "many_small_ops",
        frozenset({"many_small_ops", "python_overhead"}),
    ),
    Case(
        "loader_once",
        "job",
        "DataLoader stalling in 1 of 3 traced steps",
        "data_loader_stall",
    ),
    Case(
        "hta_trace_filter",
        "trace",
        "DLRM-style, 2 of 128 ranks, GPU idle 54%",
        "host_bound",
        frozenset({"host_bound", "comm_bound"}),
    ),
    Case(
        "tracelens_qwen1.5_h100_mi300/h100",
        "trace",
        "Qwen inference on H100, GPU busy 92%, one synchronize",
        "host_bound",
    ),
    # (by replay: removing its synchronizations saves 3.4 ms per step, more than host_bound's 2.6 ms by its rule)
    Case("tracelens_qwen1.5_h100_mi300/mi300", "trace", "the same on MI300X", "sync_points"),
    Case(
        "hta_nccl_parser_config",
        "trace",
        "A100 training, GPU idle 76%",
        "host_bound",
        frozenset({"host_bound"}),
    ),
    Case("hta_ns_resolution_trace", "trace", "V100 training step, GPU busy", "host_bound"),
    Case(
        "kineto_resnet50_num_workers_4",
        "trace",
        "ResNet-50 on V100, 1478 kernels per step",
        "launch_bound",
        frozenset({"launch_bound"}),
    ),
    Case(
        "hta_critical_path/alexnet", "trace", "AlexNet, GPU idle 99%", "host_bound", frozenset({"host_bound"})
    ),
    Case(
        "hta_cpu_only",
        "trace",
        "gloo all-reduces over the whole step, 1 of 300 ranks traced",
        "comm_wait_unknown",
    ),
    Case("hta_rank_non_gpu", "trace", "a rank's CPU ops without GPU events", "step_breakdown"),
]


def run_jobs(out: Path, names: list[str] | None = None) -> None:
    """Run every CPU job of CASES (or those `names`) into `out` (one subprocess; a failure raises with its
    output)."""
    jobs = [c.name for c in CASES if c.source == "job" and (names is None or c.name in names)]
    done = subprocess.run(
        [sys.executable, str(JOBS_SCRIPT), str(out), *jobs], capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        raise RuntimeError(f"findings jobs failed:\n{done.stdout}\n{done.stderr}")
