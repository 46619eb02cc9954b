"""A 2-rank gloo job for the what-if of a host sync: each rank trains its own model (no gradient all-reduce),
rank r does extra work (matrix products into preallocated tensors) in the forward of the steps whose number has
the parity r, and in the first window every step ends with an all-reduce of the loss read back with `.item()`
(a per-step sync, as logging the mean loss does): each step then waits for the slower rank. The second window,
a moment later on the same machine, is the job without the sync, where each rank goes at its own pace.

    torchrun --standalone --nproc_per_node 2 tests/_whatif_sync_job.py OUT_DIR

Not asserted yet: `communication=0` on the synced window predicts the job's step 23-28% above the window without
the sync (13.8 against 11.2 ms, 5.96 against 4.67 ms in two runs here); what the replay misses is open (#29).

Schedule: wait 1, warmup 1, active 6, repeat 2: windows of steps 2-7 (with the sync) and 10-15 (without); a run
folder names each by its last step (7, 15).
"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import stepscope

CYCLE = 8
STEPS = 2 * CYCLE
WINDOWS = (7, 15)
PAUSE_S = 2.0  # between windows: the window's export (a child process) gets the machine to itself
EXTRA = 24  # matrix products on a rank's heavy steps


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    a, b, c = torch.randn(256, 256), torch.randn(256, 256), torch.empty(256, 256)
    monitor = stepscope.performance_monitor(
        model, out_dir=out_dir, wait=1, warmup=1, active=6, repeat=2, console=False, profiled_ranks="all"
    )
    with monitor:
        for n in range(STEPS):
            if n == CYCLE:
                time.sleep(PAUSE_S)
            with monitor.region("forward"):
                if n % 2 == rank:
                    for _ in range(EXTRA):
                        torch.mm(a, b, out=c)
                loss = F.cross_entropy(model(x), y)
            with monitor.region("backward"):
                loss.backward()
            with monitor.region("optimizer"):
                optimizer.step()
                optimizer.zero_grad()
            if n < CYCLE:
                mean = loss.detach().clone()
                dist.all_reduce(mean)
                mean.item()
            monitor.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
