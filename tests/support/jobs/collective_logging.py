"""A 2-rank gloo DDP job for the collective-logging test: `worker` for torch.multiprocessing.spawn
(tests/support/jobs/spawned.py), or
`torchrun --standalone --nproc_per_node 2 tests/support/jobs/collective_logging.py OUT_DIR`.

Three equal Linear layers and a bucket cap of one layer's weight: DDP then issues exactly one all-reduce per
layer in each backward (bucket = bias + weight >= cap), so a step has 3 all-reduces of 32*32+32 floats.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch import nn

import stepscope

WIDTH = 32
LAYERS = 3


def worker(rank: int, out_dir: str, port: int) -> None:
    """One rank, started by torch.multiprocessing.spawn: loopback rendezvous on `port`."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    os.environ.update(LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
    from tests.support.jobs.spawned import watch  # (here: run by torchrun, the script has no tests package)

    watch(out_dir, rank)
    train(out_dir, rank)


def main() -> None:
    train(sys.argv[1])


def train(out_dir: str, spawned_rank: int | None = None) -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    layers: list[nn.Module] = []
    for i in range(LAYERS):
        layers.append(nn.Linear(WIDTH, WIDTH))
        if i < LAYERS - 1:
            layers.append(nn.ReLU())
    model = nn.Sequential(*layers)
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=WIDTH * WIDTH * 4 / 2**20)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    monitor = stepscope.performance_monitor(
        model,
        out_dir=out_dir,
        wait=1,
        warmup=1,
        active=2,
        repeat=1,
        record_shapes=True,
        comm_logger_step=2,  # inside the window: moved to step 4
        profiled_ranks="all",
        console=False,
    )
    with monitor:
        for _ in range(6):
            loss = ddp(torch.randn(8, WIDTH)).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            monitor.step()
    if spawned_rank is not None:
        from tests.support.jobs.spawned import work_done

        work_done(out_dir, spawned_rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
