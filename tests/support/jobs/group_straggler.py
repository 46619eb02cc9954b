"""A 4-rank (2, 2) mesh ("dp", "tp") on gloo whose rank 3 is slow before its tensor-parallel collectives:
`torchrun --standalone --nproc_per_node 4 tests/support/jobs/group_straggler.py OUT_DIR [SLOW_MS]`.

As `mesh` in tests/support/jobs/parallelism.py (a Linear pair made tensor parallel over "tp", the gradients all-reduced
over "dp"), but rank 3 spends SLOW_MS (default 40) ms a step in a forward pre-hook of the model (a sleep inside a
`record_function("extra_input_work")`: waiting on input, say; a sleep rather than compute so that the slow rank
does not take one of the machine's two cores from the others' gloo threads), before the row-wise layer's all-reduce in its tp group {2, 3}. Each rank writes, beside the run folder,
`times_rank{R}.json`: per step (loop iteration i is ProfilerStep#i), the wall time of its forward and backward passes
(the tp all-reduce is waited for in them: DTensor waits for its async functional collective where the output is
used) and of its extra work (ms), from which the tests tell how long rank 2 waits for rank 3. Steps 2-6 are recorded on every
rank (wait 1, warmup 1, active 5: the straggler test takes the steps as units), shapes recorded.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import stepscope

WIDTH = 16
STEPS = 8
SLOW_RANK = 3
ACTIVE = 5


def main(out_dir: str, slow_ms: float) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    torch.set_num_threads(1)
    mesh2d = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    rank = dist.get_rank()
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH))
    parallelize_module(model, mesh2d["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    dp = mesh2d.get_group("dp")
    extra: list[float] = []  # per step, the slow rank's extra time (ms)
    compute: list[float] = []  # per step, the forward and backward passes' wall time (ms)

    def slow(_module: nn.Module, _args: object) -> None:
        t0 = time.perf_counter()
        with torch.profiler.record_function("extra_input_work"):
            time.sleep(slow_ms / 1e3)
        extra.append((time.perf_counter() - t0) * 1e3)

    if rank == SLOW_RANK:
        model.register_forward_pre_hook(slow)
    monitor = stepscope.performance_monitor(
        model, out_dir=out_dir, wait=1, warmup=1, repeat=1, record_shapes=True,
        active=ACTIVE, profiled_ranks="all", console=False,
    )  # fmt: skip
    with monitor:
        for _ in range(STEPS):
            t0 = time.perf_counter()
            model(torch.randn(4, WIDTH)).square().mean().backward()
            compute.append((time.perf_counter() - t0) * 1e3)
            if rank != SLOW_RANK:
                extra.append(0.0)
            for p in model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad.to_local(), group=dp)
            monitor.step()
    times = {"compute_ms": compute, "extra_ms": extra}
    (Path(out_dir) / f"times_rank{rank}.json").write_text(json.dumps(times))
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 40.0)
