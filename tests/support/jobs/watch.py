"""A DDP job on gloo whose steps turn slow with nobody watching but stepscope's watch (issue 45):
`torchrun --standalone --nproc_per_node N tests/support/jobs/watch.py OUT_DIR MODE ARG [STEPS]`.

MODE `burst`: rank 1's data loading sleeps SLOW_MS (50) ms in each of 5 steps from step ARG; the other ranks wait
for it at the gradients' all-reduce. MODE `every`: every rank's step sleeps SLOW_MS ms at each ARG-th step (ARG,
2 ARG, ...), outside data loading (a checkpoint, say). MODE `steady`: nothing is slow.

Each step fetches a batch from a DataLoader (its dataset's `__getitem__` holds the sleep in burst mode), runs a small
MLP forward and backward under DDP and an SGD step. The monitor records with `watch=True` on every rank and no
window of its own before the watch's (on_demand=True: the reference window is the watch's). Rank 0 writes
`slow.json` beside the run folder: the slow steps, their rank, and the sleep each took.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

import stepscope

SLOW_MS = 50.0
BURST = 5
SLOW_RANK = 1
WIDTH = 256
BATCH = 32
DEVICE_S = 0.005  # each step also waits this long, as for a GPU's work (the CPU idles meanwhile)


class Batches(Dataset[torch.Tensor]):
    def __init__(self, steps: int, slow: set[int]) -> None:
        self.steps, self.slow = steps, slow

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, index: int) -> torch.Tensor:
        if index in self.slow:
            time.sleep(SLOW_MS / 1e3)
        return torch.randn(BATCH, WIDTH)


def main(out_dir: str, mode: str, arg: int, steps: int) -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    rank = dist.get_rank()
    burst = set(range(arg, arg + BURST)) if mode == "burst" else set()
    every = arg if mode == "every" else 0
    data = Batches(steps, burst if rank == SLOW_RANK else set())
    # (batch_size None: one item is one step's batch, so item i is loaded in step i)
    loader = DataLoader(data, batch_size=None, shuffle=False)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    monitor = stepscope.performance_monitor(
        model, out_dir=out_dir, watch=True, on_demand=True, warmup=1, active=3,
        profiled_ranks="all", console=False, report=False,
    )  # fmt: skip
    with monitor:
        for step, batch in enumerate(loader):
            loss = model(batch).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            time.sleep(DEVICE_S)
            if every and step and step % every == 0:
                time.sleep(SLOW_MS / 1e3)
            monitor.step()
    if rank == 0:
        slow = sorted(burst) if burst else [s for s in range(1, steps) if every and s % every == 0]
        doc = {"mode": mode, "steps": slow, "rank": SLOW_RANK if burst else None, "slow_ms": SLOW_MS}
        (Path(out_dir) / "slow.json").write_text(json.dumps(doc))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 500)
