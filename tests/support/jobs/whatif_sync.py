"""A 2-rank gloo job for the what-if of a host sync: each rank trains its own model (no gradient all-reduce),
rank r waits DEVICE_MS on its "device" in the forward of the steps whose number has
the parity r, and every other pair of steps (the steps n with n % 4 in {0, 1}) ends each step with an all-reduce
of the loss read back with `.item()` (a per-step sync, as logging the mean loss does): such a step waits for the
slower rank. The pairs of steps between them, a moment later in the same window, are the job without the sync,
where each rank goes at its own pace (each rank's pair: one heavy step and one light one).

    torchrun --standalone --nproc_per_node 2 tests/support/jobs/whatif_sync.py OUT_DIR

Schedule: wait 1, warmup 1, active 12, repeat 2: windows of steps 2-13 and 16-27; a run folder names each by its
last step (13, 27). A step's number is its iteration's (from 0).
"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import stepscope

CYCLE = 14
STEPS = 2 * CYCLE
WINDOWS = (13, 27)
PAUSE_S = 2.0  # between windows: the window's export (a child process) gets the machine to itself
DEVICE_MS = 8.0  # a rank's heavy steps wait this long on their "device" (see whatif_ddp.Device)


def synced(step: int) -> bool:
    return step % 4 in (0, 1)


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    monitor = stepscope.performance_monitor(
        model, out_dir=out_dir, wait=1, warmup=1, active=12, repeat=2, console=False, profiled_ranks="all"
    )
    with monitor:
        for n in range(STEPS):
            if n and n % CYCLE == 0:
                time.sleep(PAUSE_S)
            with monitor.region("forward"):
                if n % 2 == rank:
                    # waiting, not computing: with the sync, one rank computes while the other waits; without
                    # it, both compute at once, and on 2 busy cores that contention would be what is measured
                    time.sleep(DEVICE_MS / 1e3)
                loss = F.cross_entropy(model(x), y)
            with monitor.region("backward"):
                loss.backward()
            with monitor.region("optimizer"):
                optimizer.step()
                optimizer.zero_grad()
            if synced(n):
                mean = loss.detach().clone()
                dist.all_reduce(mean)
                mean.item()
            monitor.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
