"""Jobs the tests run in other processes: a training script of tests/support/train.py's model (`run_job`), the
parallel jobs of tests/support/jobs/parallelism.py and tests/support/jobs/two_ranks.py under torchrun, and `stepscope merge` under an
address-space limit."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import warnings
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SCRIPTS = Path(__file__).resolve().parent

PRELUDE = f"""
import atexit, os, signal, sys
# Ctrl-C as a terminal delivers it, even where the suite runs in the background (which ignores SIGINT, and the job
# would inherit that)
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.path.insert(0, {str(REPO)!r})
import torch
import stepscope
from tests.support.train import make_training
atexit.register(lambda: print("user atexit ran", flush=True))
step, model = make_training()
"""


def run_job(tmp_path: Path, body: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "job.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    return subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, **(env or {}), "PYTHONFAULTHANDLER": "1"},
    )


TORCH_EXIT_ABORT = "terminate called without an active exception"


def run_ranks(
    cmd: Sequence[str], out: Path, *, check: bool = False, **kwargs: object
) -> subprocess.CompletedProcess[str]:
    """`subprocess.run(cmd, capture_output=True, **kwargs)` of a multi-rank gloo job (torchrun, `stepscope run
    --nproc-per-node`), run once more when a rank died of torch's own abort at exit (`terminate called without an
    active exception`, after all its work: docs/reliability.md). What the first run wrote under `out` (entries
    that were not there before it) is removed first, so that the test checks a run that ended cleanly; the first
    death is a warning of the test. A second abort, or any other failure, is the test's."""
    out.mkdir(parents=True, exist_ok=True)
    before = set(out.iterdir())
    for attempt in range(2):
        done = subprocess.run(list(cmd), capture_output=True, **kwargs)  # type: ignore[call-overload]
        err = done.stderr if isinstance(done.stderr, str) else done.stderr.decode(errors="replace")
        if done.returncode == 0 or TORCH_EXIT_ABORT not in err or attempt:
            break
        warnings.warn(
            f"a rank died of torch's abort at exit (run again):\n{err[-2000:]}", RuntimeWarning, stacklevel=2
        )
        for entry in set(out.iterdir()) - before:
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    if check and done.returncode:
        err = done.stderr if isinstance(done.stderr, str) else done.stderr.decode(errors="replace")
        raise AssertionError(f"{' '.join(map(str, cmd))} ended with {done.returncode}:\n{err[-3000:]}")
    return done  # type: ignore[no-any-return]


PARALLEL_JOBS = SCRIPTS / "parallelism.py"


def run_parallel_job(job: str, ranks: int, out: Path) -> Path:
    """Run a tiny parallel job of tests/support/jobs/parallelism.py with torchrun on gloo; its run folder."""
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--standalone", "--nproc_per_node", str(ranks), str(PARALLEL_JOBS), job, str(out)]
    run_ranks(cmd, out, check=True, timeout=240)
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return run_dir


def trace_ops(run_dir: Path, rank: int) -> Counter[str]:
    """Count of each c10d / functional collective op in a rank's trace, read with json (not stepscope)."""
    (path,) = (run_dir / "traces").glob(f"rank{rank}_*.json.gz")
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    return Counter(e["name"] for e in events if "c10d" in e.get("name", "") and e.get("ph") == "X")


@pytest.fixture(scope="module")
def fsdp2_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_parallel_job("fsdp2", 2, tmp_path_factory.mktemp("fsdp2"))


DIST_JOB = SCRIPTS / "two_ranks.py"


def torchrun(out_dir: Path, ranks: str) -> list[dict[str, object]]:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1", PYTHONPATH=str(DIST_JOB.parents[3]))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(DIST_JOB),
        str(out_dir),
        ranks,
    ]
    result = run_ranks(cmd, out_dir, text=True, env=env, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads((out_dir / f"report_rank{r}.json").read_text()) for r in (0, 1)]


_PEAK_OF = (
    "import os, subprocess, sys\n"
    "child = subprocess.Popen(sys.argv[1:])\n"
    "_, status, usage = os.wait4(child.pid, 0)\n"
    "print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)\n"
)


def merge_in_child(folder: Path, out: Path, address_space: int) -> tuple[int, str, int, float]:
    """`stepscope merge FOLDER -o OUT` in a child whose address space is limited: status, stderr, peak RSS in
    MiB, wall seconds."""
    script = (
        "import resource, sys\n"
        f"resource.setrlimit(resource.RLIMIT_AS, ({address_space}, {address_space}))\n"
        "from stepscope.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", _PEAK_OF, sys.executable, "-c", script, "merge", str(folder), "-o", str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"},
        timeout=300,
    )
    code, peak_kib = done.stdout.split()[-2:]
    return int(code), done.stderr, int(peak_kib) // 1024, time.perf_counter() - t0


DDP_JOB = Path(__file__).with_name("ddp.py")


def run_ddp_job(
    out_dir: Path,
    *,
    profiled_ranks: str | None = "all",
    bucket_cap_mb: float | None = None,
    slow_rank: int = 2,
    delay_ms: float = 60.0,
    sleep_ms: float = 0.0,
    nproc: int = 4,
    steps: int | None = None,
    run_options: Sequence[str] = (),
) -> Path:
    """`stepscope run --nproc-per-node 4 [--profiled-ranks R] tests/support/jobs/ddp.py`, the default schedule: 4 gloo
    ranks train a 256-512-512-10 MLP under DDP (two gradient buckets unless `bucket_cap_mb` makes one), and
    `slow_rank` sleeps `delay_ms` in its collate_fn (every rank `sleep_ms` after each step). `profiled_ranks` None: the default (rank 0 only); `nproc` ranks, `steps` steps (the job's 12 by default), `run_options` for `stepscope run`. Returns
    the run folder; each rank's report of what it did is `ddp_rank{R}.json` in `out_dir`."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(DDP_JOB.parents[3]))
    cmd = [
        sys.executable,
        "-m",
        "stepscope",
        "run",
        "--nproc-per-node",
        str(nproc),
        "--no-console",
        "--no-report",
    ]
    cmd += ["--out-dir", str(out_dir / "runs")]
    if profiled_ranks is not None:
        cmd += ["--profiled-ranks", profiled_ranks]
    cmd += [
        *run_options,
        str(DDP_JOB),
        "--slow-rank",
        str(slow_rank),
        "--delay-ms",
        str(delay_ms),
        "--report-dir",
        str(out_dir),
    ]
    if bucket_cap_mb is not None:
        cmd += ["--bucket-cap-mb", str(bucket_cap_mb)]
    if sleep_ms:
        cmd += ["--sleep-ms", str(sleep_ms)]
    if steps is not None:
        cmd += ["--steps", str(steps)]
    result = run_ranks(cmd, out_dir, text=True, env=env, cwd=out_dir, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = (out_dir / "runs").iterdir()
    return run_dir
