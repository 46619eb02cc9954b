"""A real CPU job for the findings priced by replay (tests/analysis/test_priced_findings.py): time one finding must price
alone.

    python tests/support/jobs/priced_findings.py OUT_DIR

- `overlap`: the optimizer's region holds, besides the optimizer's step, SLEEP_S of Python that runs no torch op
  (a metrics sync, a checkpoint written inline): `optimizer_bound` prices the whole region and says it is Python;
  `python_overhead` leaves the optimizer's time out (it once priced the sleep a second time).
"""

from __future__ import annotations

import sys
import time

SCHEDULE = {"wait": 1, "warmup": 1, "active": 4, "repeat": 1}
STEPS = 7
SLEEP_S = 0.008


def run(out: str) -> None:
    import torch
    import torch.nn.functional as F

    import stepscope

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = [(torch.randn(64, 256), torch.randint(0, 10, (64,))) for _ in range(STEPS)]
    monitor = stepscope.performance_monitor(model, out_dir=out, console=False, **SCHEDULE)
    with monitor:
        for x, y in batches:
            with monitor.region("forward"):
                loss = F.cross_entropy(model(x), y)
            with monitor.region("backward"):
                loss.backward()
            with monitor.region("optimizer"):
                optimizer.step()
                time.sleep(SLEEP_S)
                optimizer.zero_grad()
            monitor.step()


if __name__ == "__main__":
    run(sys.argv[1])
