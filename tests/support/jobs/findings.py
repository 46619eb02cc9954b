"""The findings bench: small real CPU training jobs, each with one injected problem, profiled by stepscope.

    python tests/support/jobs/findings.py OUT_DIR JOB [JOB ...]

writes one run folder per job under OUT_DIR/JOB. Jobs (and the finding each should lead with, asserted in
tests/analysis/test_findings_bench.py):

- healthy:         an MLP trained from pre-built batches; forward and backward hold the step (no HIGH finding)
- loader_stall:    the DataLoader sleeps 0.25 ms per sample in the main process (data_loader_stall)
- loader_fixed:    the same data with 8 loader workers (the fix; the diff test compares the two)
- heavy_optimizer: an optimizer that takes an SVD of every weight matrix each step (optimizer_bound)
- sync_python:     .item() on the loss plus 20 ms of pure-Python metrics each step (python_overhead)
- tiny_ops:        a forward of thousands of elementwise ops on tiny tensors (many_small_ops)
- loader_once:     3 traced steps; the DataLoader's collate sleeps 30 ms in the second of them only, as a
                   preempted or slow read would (an occasional data_loader_stall, LOW, "in 1 of 3 steps")

The two loader jobs record a longer window (LOADER_SCHEDULE) and run LOADER_PLAIN_STEPS more steps after it:
`stepscope diff` compares the step time over the plain steps of metrics.jsonl and the phases over the window's
steps, and a few steps of each cannot show a change at 95% past one slow step.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

STEPS = 7  # wait 2, warmup 1, active 4
SCHEDULE = {"wait": 2, "warmup": 1, "active": 4, "repeat": 1}
# loader_once: active 3 (steps 3 to 5); its collate sleeps ONCE_SLEEP_S while building the batch of step 4
ONCE_ACTIVE = 3
ONCE_STALL_STEP = 4
ONCE_SLEEP_S = 0.03
LOADER_SCHEDULE = {**SCHEDULE, "active": 8}
LOADER_PLAIN_STEPS = 12  # after the window: with step 1, 13 plain steps to compare (diff needs 8)


class SlowSamples:
    """A map-style dataset whose every sample costs `sleep_s` of I/O-like waiting."""

    def __init__(self, n: int, features: int, sleep_s: float) -> None:
        import torch

        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, features, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)
        self.sleep_s = sleep_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> Any:
        time.sleep(self.sleep_s)
        return self.x[i], self.y[i]


class StallOnce:
    """A collate_fn that stacks the batch and, for the `at`-th batch only (from 0), sleeps `sleep_s` first."""

    def __init__(self, at: int, sleep_s: float) -> None:
        self.at, self.sleep_s, self.calls = at, sleep_s, 0

    def __call__(self, batch: list[Any]) -> Any:
        import torch

        if self.calls == self.at:
            time.sleep(self.sleep_s)
        self.calls += 1
        return torch.stack([x for x, _ in batch]), torch.stack([y for _, y in batch])


def _mlp(width: int = 1024) -> Any:
    from torch import nn

    return nn.Sequential(
        nn.Linear(256, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)
    )


class SvdOptimizer:
    """SGD that also takes the SVD of every weight matrix each step (a stand-in for a costly preconditioner)."""

    def __init__(self, params: Any, lr: float = 0.01) -> None:
        import torch

        self.inner = torch.optim.SGD(params, lr=lr)

    def step(self) -> None:
        import torch

        with torch.no_grad():
            for group in self.inner.param_groups:
                for p in group["params"]:
                    if p.grad is not None and p.dim() == 2:
                        torch.linalg.svd(p.grad[:, :256], full_matrices=False)
        self.inner.step()

    def zero_grad(self) -> None:
        self.inner.zero_grad(set_to_none=True)


def run(job: str, out: Path) -> None:
    import torch
    import torch.nn.functional as F

    import stepscope

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = _mlp()
    optimizer: Any = torch.optim.SGD(model.parameters(), lr=0.01)
    batches: Any
    schedule, steps = SCHEDULE, STEPS
    if job in ("loader_stall", "loader_fixed"):
        schedule = LOADER_SCHEDULE
        steps = schedule["wait"] + schedule["warmup"] + schedule["active"] + LOADER_PLAIN_STEPS
        data = SlowSamples(64 * (steps + 1), 256, 0.00025)
        workers = 8 if job == "loader_fixed" else 0
        batches = torch.utils.data.DataLoader(data, batch_size=64, num_workers=workers)
    elif job == "loader_once":
        schedule = {**SCHEDULE, "active": ONCE_ACTIVE}
        steps = schedule["wait"] + schedule["warmup"] + ONCE_ACTIVE
        g = torch.Generator().manual_seed(0)
        samples = [
            (torch.randn(256, generator=g), torch.randint(0, 10, (), generator=g)) for _ in range(64 * steps)
        ]
        collate = StallOnce(ONCE_STALL_STEP, ONCE_SLEEP_S)
        batches = torch.utils.data.DataLoader(samples, batch_size=64, collate_fn=collate)
    else:
        g = torch.Generator().manual_seed(0)
        batches = [(torch.randn(64, 256, generator=g), torch.randint(0, 10, (64,), generator=g))] * STEPS
    if job == "heavy_optimizer":
        optimizer = SvdOptimizer(model.parameters())
    tiny = [torch.randn(4) for _ in range(8)]

    monitor = stepscope.performance_monitor(model, out_dir=str(out), console=False, **schedule)
    with monitor:
        for _, (x, y) in zip(range(steps), batches, strict=False):
            with monitor.region("forward"):
                h = model(x)
                if job == "tiny_ops":
                    acc = tiny[0]
                    for i in range(1500):
                        acc = acc * tiny[i % 8] + 0.5
                    h = h + acc.sum() * 0
                loss = F.cross_entropy(h, y)
            with monitor.region("backward"):
                loss.backward()
            with monitor.region("optimizer"):
                optimizer.step()
                optimizer.zero_grad()
            if job == "sync_python":
                value = loss.item()
                total = 0.0
                deadline = time.perf_counter() + 0.02
                while time.perf_counter() < deadline:
                    total += value * 1e-9
            monitor.step()


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    for job in argv[1:]:
        run(job, out / job)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
