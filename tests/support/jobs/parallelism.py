"""Tiny parallel jobs on gloo for the parallelism tests: `torchrun --standalone --nproc_per_node N
tests/support/jobs/parallelism.py JOB OUT_DIR`, JOB one of:

- `fsdp2`: `fully_shard` on 4 Linear layers and on the model (2 ranks): all-gathers in forward and backward,
  reduce-scatters of the gradients (gloo runs each reduce-scatter as an all-reduce range);
- `mesh`: a (2, 2) mesh ("dp", "tp") on 4 ranks: a Linear pair made tensor parallel over "tp" with
  `parallelize_module` (colwise then rowwise: functional all-reduce in forward), and the gradients all-reduced
  over "dp" with an explicit `all_reduce` on the dp group.

Each records steps 2-3 on every rank (wait 1, warmup 1, active 2), shapes recorded.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch import nn

import stepscope

WIDTH = 16
STEPS = 5


def _monitor(model: nn.Module, out_dir: str):  # type: ignore[no-untyped-def]
    return stepscope.performance_monitor(
        model, out_dir=out_dir, wait=1, warmup=1, active=2, repeat=1, record_shapes=True,
        profiled_ranks="all", console=False,
    )  # fmt: skip


def fsdp2(out_dir: str) -> None:
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo")
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(4)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with _monitor(model, out_dir) as monitor:
        for _ in range(STEPS):
            model(torch.randn(4, WIDTH)).square().mean().backward()
            opt.step()
            opt.zero_grad()
            monitor.step()
    dist.destroy_process_group()


def mesh(out_dir: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh2d = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH))
    parallelize_module(model, mesh2d["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    dp = mesh2d.get_group("dp")
    with _monitor(model, out_dir) as monitor:
        for _ in range(STEPS):
            model(torch.randn(4, WIDTH)).square().mean().backward()
            for p in model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad.to_local(), group=dp)
            monitor.step()
    dist.destroy_process_group()


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    {"fsdp2": fsdp2, "mesh": mesh}[sys.argv[1]](sys.argv[2])


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
