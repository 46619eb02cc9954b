"""An unmodified DDP training script (no stepscope in it) for the findings tests, and `run_ddp_job`, which
profiles it with `stepscope run --nproc-per-node 4`:

    stepscope run --nproc-per-node 4 --profiled-ranks R,... tests/_ddp_job.py --steps 7 --slow-rank 2

4 gloo ranks train a 256-512-512-10 MLP under DDP with its default buckets (two of them: the first is 1 MB);
the slow rank's `collate_fn` sleeps `--delay-ms` (60 ms) per batch, so every other rank waits for it in the
gradient all-reduce. `--sleep-ms` makes every rank sleep that long after each optimizer step (Python outside
any op, on all ranks alike). `run_ddp_job` chooses which ranks stepscope traces.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

RANKS = 4
SCHEDULE = ["--wait", "1", "--warmup", "1", "--active", "3"]
STEPS = 7  # one step more than wait + warmup + active: the last window is exported before the job ends


def run_ddp_job(
    out: Path, profiled_ranks: str = "0", *, delay_ms: float = 60.0, sleep_ms: float = 0.0
) -> Path:
    """Run this script under `stepscope run --nproc-per-node 4 --profiled-ranks PROFILED_RANKS` in `out`; the
    run folder."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", PYTHONUNBUFFERED="1")
    env.pop("STEPSCOPE_CONSOLE", None)
    cmd = [sys.executable, "-m", "stepscope", "run", "--nproc-per-node", str(RANKS), *SCHEDULE]
    cmd += ["--profiled-ranks", profiled_ranks, "--no-console", "--no-report", __file__]
    cmd += ["--steps", str(STEPS), "--delay-ms", str(delay_ms), "--sleep-ms", str(sleep_ms)]
    out.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(cmd, cwd=out, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = (out / "stepscope_runs").iterdir()
    return run_dir


def main() -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.utils.data import DataLoader

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--slow-rank", type=int, default=2, help="-1: no rank is slow")
    parser.add_argument("--delay-ms", type=float, default=60.0, help="the slow rank's collate_fn sleeps this")
    parser.add_argument("--sleep-ms", type=float, default=0.0, help="every rank sleeps this after each step")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    delay_s = args.delay_ms / 1e3 if rank == args.slow_rank else 0.0

    def collate(batch: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        if delay_s:
            time.sleep(delay_s)
        return torch.stack([x for x, _ in batch]), torch.stack([y for _, y in batch])

    g = torch.Generator().manual_seed(rank)
    data = [
        (torch.randn(256, generator=g), torch.randint(0, 10, (), generator=g)) for _ in range(32 * args.steps)
    ]
    loader = DataLoader(data, batch_size=32, collate_fn=collate)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for x, y in loader:
        loss = nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if args.sleep_ms:
            time.sleep(args.sleep_ms / 1e3)
    print(f"rank {rank}: trained {len(loader)} steps")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
