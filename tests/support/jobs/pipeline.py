"""Tiny pipeline-parallel jobs on gloo for the pipeline tests: `torchrun --standalone --nproc_per_node N
tests/support/jobs/pipeline.py JOBS OUT_DIR [MICROBATCHES]`, JOBS a comma-separated list run one after the other in one
process group (one torchrun start for all), each into its own run folder under OUT_DIR/JOB:

- `gpipe`, `1f1b`: each rank is one stage of `torch.distributed.pipelining` (a manual `PipelineStage` split: two
  Linear layers per stage) under ScheduleGPipe / Schedule1F1B, MICROBATCHES micro-batches (4 by default) a step;
- `allreduce`: no pipeline: each rank trains the same layers on its own batch and all-reduces the gradients.

Every rank records steps 2-3 (wait 1, warmup 1, active 2), shapes recorded.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import stepscope

WIDTH = 256
BATCH = 128
STEPS = 5


def _monitor(model: nn.Module, out_dir: str):  # type: ignore[no-untyped-def]
    return stepscope.performance_monitor(
        model, out_dir=out_dir, wait=1, warmup=1, active=2, repeat=1, record_shapes=True,
        profiled_ranks="all", console=False,
    )  # fmt: skip


def _train(pipe: Any, opt: torch.optim.Optimizer, model: nn.Module, out_dir: str) -> None:
    """STEPS pipeline steps under the monitor: the first stage feeds the batch, the last the target."""
    rank, world = dist.get_rank(), dist.get_world_size()
    with _monitor(model, out_dir) as monitor:
        for _ in range(STEPS):
            if rank == 0:
                pipe.step(torch.randn(BATCH, WIDTH))
            elif rank == world - 1:
                pipe.step(target=torch.randn(BATCH, WIDTH), losses=[])
            else:
                pipe.step()
            opt.step()
            opt.zero_grad()
            monitor.step()


def _layers() -> nn.Module:
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH))


def pipeline(schedule: str, out_dir: str, microbatches: int) -> None:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    rank, world = dist.get_rank(), dist.get_world_size()
    model = _layers()
    stage = PipelineStage(model, stage_index=rank, num_stages=world, device=torch.device("cpu"))
    kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
    pipe = kind(
        stage, n_microbatches=microbatches, loss_fn=lambda out, target: (out - target).square().mean()
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    _train(pipe, opt, model, out_dir)


def interleaved(out_dir: str, microbatches: int) -> None:
    from torch.distributed.pipelining import PipelineStage, ScheduleInterleaved1F1B

    rank, world = dist.get_rank(), dist.get_world_size()
    models = [_layers() for _ in range(2)]
    stages = [
        PipelineStage(m, stage_index=rank + i * world, num_stages=2 * world, device=torch.device("cpu"))
        for i, m in enumerate(models)
    ]
    pipe = ScheduleInterleaved1F1B(
        stages, n_microbatches=microbatches, loss_fn=lambda out, target: (out - target).square().mean()
    )
    params = [p for m in models for p in m.parameters()]
    opt = torch.optim.SGD(params, lr=0.01)
    _train(pipe, opt, models[0], out_dir)


def allreduce(out_dir: str) -> None:
    model = _layers()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with _monitor(model, out_dir) as monitor:
        for _ in range(STEPS):
            model(torch.randn(BATCH, WIDTH)).square().mean().backward()
            for p in model.parameters():
                assert p.grad is not None
                dist.all_reduce(p.grad)
            opt.step()
            opt.zero_grad()
            monitor.step()


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    jobs, out = sys.argv[1].split(","), Path(sys.argv[2])
    microbatches = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    dist.init_process_group("gloo")
    for job in jobs:
        if job == "allreduce":
            allreduce(str(out / job))
        elif job == "interleaved":
            interleaved(str(out / job), microbatches)
        else:
            pipeline(job, str(out / job), microbatches)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
