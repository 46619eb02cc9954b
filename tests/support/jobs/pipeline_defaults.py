"""A 2-stage GPipe job (torch.distributed.pipelining, 4 micro-batches, gloo) under the monitor at its default
options (no record_shapes: the traces name no peer), which measures its own bubble:

    torchrun --standalone --nproc_per_node 2 tests/support/jobs/pipeline_defaults.py OUT_DIR

Each rank times every wait of the schedule on its point-to-point messages (`schedules._wait_batch_p2p`, which the
schedule calls for each receive and at the end for its sends; `_sorted_batch_p2p` tells which are receives) and each step's wall time, and writes
OUT_DIR/waits_rank{R}.json: {step: [seconds waiting on receives, on sends, seconds of the step]}. Step numbers are the monitor's.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import stepscope

WIDTH, BATCH, STEPS, MICROBATCHES = 256, 128, 14, 4


def main() -> None:
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe, schedules

    out = Path(sys.argv[1])
    torch.manual_seed(0)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    waited = [0.0, 0.0]  # this step: waiting on receives, on sends
    wait, batch = schedules._wait_batch_p2p, schedules._sorted_batch_p2p

    class Works(list):  # type: ignore[type-arg]
        receives = False

    def tagged_batch(ops: Any, desc: str | None = None) -> Any:
        out = batch(ops, desc=desc)
        for key, works in list(out.items()):
            out[key] = tagged = Works(works)
            tagged.receives = "recv" in (desc or "")
        return out

    def timed_wait(works: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return wait(works)
        finally:
            waited[0 if getattr(works, "receives", False) else 1] += time.perf_counter() - t0

    # the schedule looks both up in its module at each call
    schedules._wait_batch_p2p, schedules._sorted_batch_p2p = timed_wait, tagged_batch
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH))
    stage = PipelineStage(model, stage_index=rank, num_stages=world, device=torch.device("cpu"))
    pipe = ScheduleGPipe(
        stage, n_microbatches=MICROBATCHES, loss_fn=lambda out, target: (out - target).square().mean()
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    measured: dict[int, list[float]] = {}
    monitor = stepscope.performance_monitor(
        model, out_dir=str(out / "runs"), profiled_ranks="all", console=False
    )
    with monitor:
        for step in range(STEPS):
            waited[:], t0 = [0.0, 0.0], time.perf_counter()
            if rank == 0:
                pipe.step(torch.randn(BATCH, WIDTH))
            else:
                pipe.step(target=torch.randn(BATCH, WIDTH), losses=[])
            opt.step()
            opt.zero_grad()
            measured[step] = [waited[0], waited[1], time.perf_counter() - t0]
            monitor.step()
    (out / f"waits_rank{rank}.json").write_text(json.dumps(measured))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
