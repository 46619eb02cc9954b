"""A 2-rank gloo job whose model changes its layers' outputs in place (`out = layer(x); out += 1.0`), for the test
that the collective logger changes nothing the user's code computes or raises: `worker` for
torch.multiprocessing.spawn (tests/support/jobs/spawned.py), with the wrapper (ddp | fsdp2), whether the monitor logs collectives, and where each
rank writes its losses (one float.hex per step: bit-identical runs have identical files).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import stepscope
from tests.support.jobs.spawned import watch, work_done

WIDTH = 16
STEPS = 6


class InPlace(nn.Module):
    """Linear layers whose outputs are changed in place, in the forward and (once) on the model's output."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            out = layer(x)
            out += 1.0
            x = torch.relu(out) if layer is not self.layers[-1] else out
        return x


def worker(rank: int, out_dir: str, port: int, wrapper: str, logged: bool) -> None:
    watch(out_dir, rank)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    os.environ.update(LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = InPlace()
    if wrapper == "ddp":
        wrapped: nn.Module = nn.parallel.DistributedDataParallel(model)
    else:
        from torch.distributed.fsdp import fully_shard

        for layer in model.layers:
            fully_shard(layer)
        wrapped = fully_shard(model)
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(rank)
    losses = []
    options = {"comm_logger_step": 1} if logged else {"enabled": False}
    monitor = stepscope.performance_monitor(
        model, out_dir=out_dir, wait=3, warmup=0, active=1, repeat=1, profiled_ranks="all", console=False,
        **options,
    )  # fmt: skip
    with monitor:
        for _ in range(STEPS):
            out = wrapped(torch.randn(4, WIDTH, generator=data))
            out += 0.5  # in place on the model's output, in the loop
            loss = out.square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item().hex())
            monitor.step()
    Path(out_dir, f"losses{rank}.txt").write_text("\n".join(losses) + "\n")
    work_done(out_dir, rank)
    dist.destroy_process_group()
