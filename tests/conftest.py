from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from ._traces import SHARED_TRACES


def load_chrome_trace(path: Path) -> dict[str, Any]:
    """Open a written trace the way a user's viewer would: gzip + JSON with traceEvents."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        data = json.load(fh)
    assert isinstance(data, dict) and isinstance(data.get("traceEvents"), list), path
    return data


def profiler_steps(path: Path) -> list[int]:
    """The N of every ProfilerStep#N span in a written trace, sorted."""
    events = load_chrome_trace(path)["traceEvents"]
    return sorted(
        int(e["name"].split("#")[1]) for e in events if str(e.get("name", "")).startswith("ProfilerStep#")
    )


def require_shared_traces() -> Path:
    """The shared trace set, `../shared/traces` beside the clone. Where it is absent (a fresh clone elsewhere), a
    test that needs it is skipped, saying so; under CI (CI=true), which has the set, its absence is a failure:
    a broken path must not pass as a skip."""
    if SHARED_TRACES.is_dir():
        return SHARED_TRACES
    where = os.path.normpath(SHARED_TRACES)
    if os.environ.get("CI", "").strip().lower() in ("true", "1", "yes"):
        pytest.fail(f"CI=true but the shared trace set {where} (../shared/traces) is absent", pytrace=False)
    pytest.skip(f"needs the shared trace set ../shared/traces ({where}), absent here")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # before the test's fixtures: one that builds on a shared trace must not run (and fail) without it
    if item.get_closest_marker("shared") is not None:
        require_shared_traces()


@pytest.fixture
def shared_traces() -> Path:
    return require_shared_traces()


DDP_JOB = Path(__file__).with_name("_ddp_job.py")


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
    """`stepscope run --nproc-per-node 4 [--profiled-ranks R] tests/_ddp_job.py`, the default schedule: 4 gloo
    ranks train a 256-512-512-10 MLP under DDP (two gradient buckets unless `bucket_cap_mb` makes one), and
    `slow_rank` sleeps `delay_ms` in its collate_fn (every rank `sleep_ms` after each step). `profiled_ranks` None: the default (rank 0 only); `nproc` ranks, `steps` steps (the job's 12 by default), `run_options` for `stepscope run`. Returns
    the run folder; each rank's report of what it did is `ddp_rank{R}.json` in `out_dir`."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(DDP_JOB.parents[1]))
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
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=out_dir, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = (out_dir / "runs").iterdir()
    return run_dir


@pytest.fixture(scope="session")
def ddp_two_buckets_all_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run folder of `run_ddp_job` with every rank traced: rank 2 is 60 ms late in each step."""
    return run_ddp_job(tmp_path_factory.mktemp("ddp_two_buckets_all"), profiled_ranks="all")
