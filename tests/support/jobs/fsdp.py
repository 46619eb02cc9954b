"""Tiny FSDP jobs on gloo for tests/analysis/test_fsdp.py: `torchrun --standalone --nproc_per_node 2
tests/support/jobs/fsdp.py JOB OUT_DIR`, JOB one of:

- `exposed`: FSDP2, `fully_shard` on 4 wide Linear layers (256 x 256) fed a batch of 1: the all-gathers move
  far more than the layers compute, and every all-gather is waited on where it is issued (the default on CPU);
- `hidden`: FSDP2 with the same layers fed a batch of 2048, each unit's all-gather issued one unit ahead
  (`set_modules_to_forward_prefetch` / `set_modules_to_backward_prefetch`, unshard async), so
  the layers' compute runs while the next unit's parameters arrive;
- `fsdp1`: FSDP1, `FullyShardedDataParallel` around each layer and the model. torch 2.13 refuses it on CPU
  ("FSDP needs a non-CPU accelerator device"): kept to show it; test_fsdp.py tests FSDP1 on synthetic traces.

Each records steps 2-3 on every rank (wait 1, warmup 1, active 2), shapes recorded.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch import nn

import stepscope

WIDTH = 256
LAYERS = 4
STEPS = 5


def _monitor(model: nn.Module, out_dir: str):  # type: ignore[no-untyped-def]
    return stepscope.performance_monitor(
        model, out_dir=out_dir, wait=1, warmup=1, active=2, repeat=1, record_shapes=True,
        profiled_ranks="all", console=False,
    )  # fmt: skip


def _train(model: nn.Module, out_dir: str, batch: int) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with _monitor(model, out_dir) as monitor:
        for _ in range(STEPS):
            model(torch.randn(batch, WIDTH)).square().mean().backward()
            opt.step()
            opt.zero_grad()
            monitor.step()


def _layers() -> nn.Sequential:
    return nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])


def exposed(out_dir: str) -> None:
    from torch.distributed.fsdp import fully_shard

    model = _layers()
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    _train(model, out_dir, batch=1)


def hidden(out_dir: str) -> None:
    from torch.distributed.fsdp import FSDPModule, fully_shard

    model = _layers()
    units: list[FSDPModule] = []
    for layer in model:
        fully_shard(layer)
        units.append(layer)  # type: ignore[arg-type]
    fully_shard(model)
    for i, unit in enumerate(units):
        # torch 2.13 names it _set_unshard_async_op (public in some releases): without it, a prefetch on CPU
        # waits for its all-gather where it is issued
        (getattr(unit, "set_unshard_async_op", None) or unit._set_unshard_async_op)(True)
        if i + 1 < len(units):
            unit.set_modules_to_forward_prefetch([units[i + 1]])
        if i > 0:
            unit.set_modules_to_backward_prefetch([units[i - 1]])
    _train(model, out_dir, batch=2048)


def fsdp1(out_dir: str) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    model = _layers()
    for i in range(LAYERS):
        model[i] = FSDP(model[i], device_id=None, use_orig_params=True)
    _train(FSDP(model, device_id=None, use_orig_params=True), out_dir, batch=1)


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    {"exposed": exposed, "hidden": hidden, "fsdp1": fsdp1}[sys.argv[1]](sys.argv[2])
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
