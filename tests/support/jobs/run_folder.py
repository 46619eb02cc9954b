"""A 2-rank job for the run-folder tests, under torchrun: each rank trains on its own (no collective between the
steps), rank 0 first sleeps `delay` seconds (a slow start), then every rank runs 6 steps under a monitor that
records one window on every rank.

    python -m torch.distributed.run [--standalone] --nproc_per_node 2 tests/support/jobs/run_folder.py OUT MODE DELAY

MODE `pg`: a gloo process group exists (the run folder's name travels through its store); `env`: none (torchrun's
environment only). Each rank writes `job_rank{R}.json` in OUT: its run folder, the seconds its 6 steps and close
took, and torchrun's run id.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import stepscope
from tests.support.train import make_training


def main() -> None:
    out_dir, mode, delay = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    dist = None
    if mode == "pg":
        import torch.distributed as dist

        dist.init_process_group("gloo")
    rank = int(os.environ["RANK"])
    if rank == 0:
        time.sleep(delay)
    train_step, model = make_training(seed=rank)
    monitor = stepscope.performance_monitor(
        model,
        out_dir=str(out_dir / "runs"),
        wait=1,
        warmup=1,
        active=2,
        profiled_ranks="all",
        console=False,
        report=False,
    )
    step = monitor(train_step)
    t0 = time.perf_counter()
    for _ in range(6):
        step()
    monitor.close()
    seconds = time.perf_counter() - t0
    report = {
        "rank": rank,
        "run_dir": str(monitor.run_dir),
        "seconds": seconds,
        "run_id": os.environ.get("TORCHELASTIC_RUN_ID"),
    }
    (out_dir / f"job_rank{rank}.json").write_text(json.dumps(report))
    if dist is not None:
        dist.barrier()  # rank 1 waits here, after its monitor closed, for the slow rank 0
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
