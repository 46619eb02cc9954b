"""A 4-rank gloo DDP job for the cross-rank what-if tests: rank 2's DataLoader sleeps SLOW_MS per batch in the
first window only, so the others wait for it in DDP's all-reduce; the second window, a moment later on the same
machine, is the job without the problem.

    torchrun --standalone --nproc_per_node 4 tests/_whatif_ddp_job.py OUT_DIR

Schedule: wait 1, warmup 1, active 5, repeat 2: windows of steps 2-6 (with the slow loader) and 9-13 (without); a
run folder names each by its last step (6, 13).
"""

from __future__ import annotations

import itertools
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

import stepscope

SLOW_RANK = 2
SLOW_MS = 30.0
CYCLE = 7
STEPS = 2 * CYCLE
WINDOWS = (6, 13)
PAUSE_S = 2.0  # between windows: the window's export (a child process) gets the machine to itself
WIDTHS = (256, 512, 512, 10)
BATCH = 32


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    slow = {"on": rank == SLOW_RANK}

    def collate(batch: list[torch.Tensor]) -> torch.Tensor:
        if slow["on"]:
            time.sleep(SLOW_MS / 1e3)
        return torch.stack(batch)

    data = [torch.randn(WIDTHS[0]) for _ in range(BATCH * STEPS)]
    loader = DataLoader(data, batch_size=BATCH, collate_fn=collate)
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(itertools.pairwise(WIDTHS)):
        layers.append(nn.Linear(n_in, n_out))
        if i < len(WIDTHS) - 2:
            layers.append(nn.ReLU())
    # one bucket: one all-reduce per step
    model = nn.parallel.DistributedDataParallel(nn.Sequential(*layers), bucket_cap_mb=100)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    monitor = stepscope.performance_monitor(
        model, out_dir=out_dir, wait=1, warmup=1, active=5, repeat=2, console=False, profiled_ranks="all"
    )
    with monitor:
        for n, x in enumerate(loader):
            if n == CYCLE:
                time.sleep(PAUSE_S)
                slow["on"] = False  # (the loader collates the next batch when asked: from step 8 on)
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            monitor.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
