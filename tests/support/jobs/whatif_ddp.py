"""A 4-rank gloo DDP job for the cross-rank what-if tests: rank 2's DataLoader sleeps SLOW_MS for the batches of
odd steps, so the others wait for it in DDP's all-reduce; the even steps, a moment later in the same window, are
the job without the problem (on a shared machine the load moves more between windows seconds apart than between
steps).

    torchrun --standalone --nproc_per_node 4 tests/support/jobs/whatif_ddp.py OUT_DIR

Schedule: wait 1, warmup 1, active 12, repeat 2: windows of steps 2-13 and 16-27; a run folder names each by its
last step (13, 27). A step's number is its iteration's (from 0).
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
ACTIVE = 12
CYCLE = ACTIVE + 2
STEPS = 2 * CYCLE
WINDOWS = (13, 27)
PAUSE_S = 2.0  # between windows: the window's export (a child process) gets the machine to itself
WIDTHS = (256, 512, 512, 10)
DEVICE_MS = 8.0  # per step: see Device
BATCH = 32


class Device(nn.Module):
    """Time the step spends waiting on its device (as a GPU rank's host waits for its kernels), without using a
    core: on 2 cores, four ranks' matrix products would measure the machine's contention (a rank's compute is
    about twice as slow while all four compute as while it computes alone, as rank 2 does after its slow
    loader), which no replay of measured durations can know."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(DEVICE_MS / 1e3)
        return x


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    batches = itertools.count()

    def collate(batch: list[torch.Tensor]) -> torch.Tensor:
        # (the loader collates step n's batch at the start of step n)
        if rank == SLOW_RANK and next(batches) % 2 == 1:
            time.sleep(SLOW_MS / 1e3)
        return torch.stack(batch)

    data = [torch.randn(WIDTHS[0]) for _ in range(BATCH * STEPS)]
    loader = DataLoader(data, batch_size=BATCH, collate_fn=collate)
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(itertools.pairwise(WIDTHS)):
        layers.append(nn.Linear(n_in, n_out))
        if i < len(WIDTHS) - 2:
            layers.append(nn.ReLU())
    layers.append(Device())
    # one bucket: one all-reduce per step
    model = nn.parallel.DistributedDataParallel(nn.Sequential(*layers), bucket_cap_mb=100)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    monitor = stepscope.performance_monitor(
        model, out_dir=out_dir, wait=1, warmup=1, active=ACTIVE, repeat=2, console=False, profiled_ranks="all"
    )
    with monitor:
        for n, x in enumerate(loader):
            if n and n % CYCLE == 0:
                time.sleep(PAUSE_S)
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            monitor.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
