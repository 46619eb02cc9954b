"""Real CPU jobs for the what-if tests: every odd step has a problem and every even step does not, so that a
prediction made on the steps with it is checked against the steps next to them, measured a moment apart in the
same window (on a shared machine, the load moves more between windows seconds apart than between steps).

    python tests/support/jobs/whatif.py OUT_DIR JOB

- `loader`: a DataLoader whose samples sleep (I/O-like waiting) for the odd steps' batches;
- `optimizer`: an optimizer step whose extra work (matrix products into preallocated tensors: a cost linear in
  their number) is done twice on odd steps, once on even ones.

Schedule: wait 1, warmup 1, active 12, repeat 2: windows of steps 2-13 and 16-27; a run folder names each by its
last step (13, 27). A step's number is its iteration's (from 0).
"""

from __future__ import annotations

import sys
import time
from typing import Any

SCHEDULE = {"wait": 1, "warmup": 1, "active": 12, "repeat": 2}
CYCLE = 14
STEPS = 2 * CYCLE
WINDOWS = (13, 27)  # the last step of each
PAUSE_S = 2.0
EXTRA = 12  # matrix products of the optimizer job's step, once


class Samples:
    def __init__(self, n: int, features: int) -> None:
        import torch

        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, features, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)
        self.sleep_s = 0.0

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> Any:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return self.x[i], self.y[i]


def run(job: str, out: str) -> None:
    import torch
    import torch.nn.functional as F

    import stepscope

    torch.manual_seed(0)
    torch.set_num_threads(1)
    # steps of several ms, so that a millisecond of scheduling noise is a small share of one
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = Samples(128 * STEPS, 512)
    a, b, c = torch.randn(384, 384), torch.randn(384, 384), torch.empty(384, 384)
    loader = iter(torch.utils.data.DataLoader(data, batch_size=128))
    monitor = stepscope.performance_monitor(model, out_dir=out, console=False, **SCHEDULE)
    with monitor:
        for n in range(STEPS):
            if n and n % CYCLE == 0:
                # a wait step: the window before has ended; its export and summary (a child process) get the
                # machine to themselves instead of slowing the next window's steps
                time.sleep(PAUSE_S)
            problem = n % 2 == 1
            data.sleep_s = 0.0001 if job == "loader" and problem else 0.0  # (this step's batch is read next)
            x, y = next(loader)
            with monitor.region("forward"):
                loss = F.cross_entropy(model(x), y)
            with monitor.region("backward"):
                loss.backward()
            with monitor.region("optimizer"):
                optimizer.step()
                if job == "optimizer":
                    for _ in range(2 * EXTRA if problem else EXTRA):
                        torch.mm(a, b, out=c)
                optimizer.zero_grad()
            monitor.step()


if __name__ == "__main__":
    run(sys.argv[2], sys.argv[1])
