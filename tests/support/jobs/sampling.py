"""Tiny jobs for Python sampling (py-spy) and host memory (tracemalloc): `python tests/support/jobs/sampling.py OUT MODE`,
or under `torchrun --standalone --nproc_per_node N` (gloo, loopback; every rank profiled).

MODE `python`: each step spends most of its time in `python_hot_loop`, a pure-Python loop (~40 ms), then trains a
tiny Linear layer (its loss all-reduced under torchrun); python_sampling=True.
MODE `leak`: each step keeps a 256 KiB buffer in a module-level list (`keep_history`); host_memory=True over two
windows.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

import stepscope

HISTORY: list[bytearray] = []
LEAK_BYTES = 256 * 1024


def python_hot_loop(n: int) -> int:
    total = 0
    for i in range(n):
        total += (i * 7) % 13
    return total


def keep_history() -> None:
    HISTORY.append(bytearray(LEAK_BYTES))


def main(out_dir: str, mode: str) -> None:
    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    options = (
        {"python_sampling": True, "wait": 1, "warmup": 1, "active": 4}
        if mode == "python"
        else {"host_memory": True, "wait": 1, "warmup": 1, "active": 3, "repeat": 2}
    )
    monitor = stepscope.performance_monitor(
        model, out_dir=out_dir, profiled_ranks="all", console=False, report=False, **options
    )

    @monitor
    def step(x: torch.Tensor) -> None:
        if mode == "python":
            python_hot_loop(1_000_000)
        else:
            keep_history()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if distributed:
            dist.all_reduce(loss.detach())

    x = torch.randn(16, 32)
    steps = 1 + 1 + 4 + 1 if mode == "python" else 2 * (1 + 1 + 3) + 1
    for _ in range(steps):
        step(x)
    monitor.close()
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
