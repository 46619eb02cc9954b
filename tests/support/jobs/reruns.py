"""One small training script run several times with the same config, each run through the monitor into its own
run folder: the reruns `stepscope diff` must not call a regression.

    python tests/support/jobs/reruns.py OUT_DIR RUNS [SLEEP_MS]

writes OUT_DIR/run0 ... OUT_DIR/run{RUNS-1}, one run folder each, and with SLEEP_MS OUT_DIR/slow too: the same
job sleeping SLEEP_MS at the end of every step (a real slowdown), run once the others are done.

The runs are processes that train at the same time (forked once torch is imported, they wait for each other
before the first step); RUNS a multiple of the CPU count shares the CPUs evenly. On a machine shared with other work the load changes from second to second, and a
CPU-bound step then truly differs by 10-20% between runs made one after the other (measured on the 2-core
development machine: in separate processes, or back to back in one), which no statistic of one run can tell
from a change of code. Training at the same time, the runs meet the same load.

The job: an MLP (256-512-10, batch 64, one thread) with forward, backward and optimizer regions; STEPS steps, the
profiled window after WAIT + WARMUP steps, the other steps plain.
"""

from __future__ import annotations

import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any

STEPS = 200
SCHEDULE = {"wait": 5, "warmup": 2, "active": 6, "repeat": 1}


def run(out: Path, sleep_ms: float = 0.0, start: Any = None) -> Path:
    """Train once under a monitor into a run folder under `out`; `start`: a barrier to wait on first."""
    import torch
    import torch.nn.functional as F

    import stepscope

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 256, generator=g), torch.randint(0, 10, (64,), generator=g)
    monitor = stepscope.performance_monitor(model, out_dir=str(out), console=False, report=False, **SCHEDULE)
    if start is not None:
        start.wait()
    with monitor:
        for _ in range(STEPS):
            with monitor.region("forward"):
                loss = F.cross_entropy(model(x), y)
            with monitor.region("backward"):
                loss.backward()
            with monitor.region("optimizer"):
                optimizer.step()
                optimizer.zero_grad()
            if sleep_ms:
                time.sleep(sleep_ms / 1e3)
            monitor.step()
    assert monitor.run_dir is not None
    return monitor.run_dir


def main(argv: list[str]) -> int:
    import torch  # noqa: F401  (imported once, before the fork)

    import stepscope  # noqa: F401

    out, runs = Path(argv[0]), int(argv[1])
    sleep_ms = float(argv[2]) if len(argv) > 2 else 0.0
    status = _together([(out / f"run{i}", 0.0) for i in range(runs)])
    # the slowed run alone, after: beside the reruns, its sleeping would leave one of them a CPU to itself
    return status or (_together([(out / "slow", sleep_ms)]) if sleep_ms else 0)


def _together(jobs: list[tuple[Path, float]]) -> int:
    """Run each (out, sleep_ms) in its own process, all starting their first step together; the first failure."""
    ctx = multiprocessing.get_context(
        "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    )
    start = ctx.Barrier(len(jobs))
    workers = [ctx.Process(target=run, args=(where, sleep, start)) for where, sleep in jobs]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    failed = [w.exitcode for w in workers if w.exitcode]
    return failed[0] if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
