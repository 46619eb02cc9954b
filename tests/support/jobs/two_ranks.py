"""A 2-rank gloo job for the multi-rank tests: run with torchrun --standalone --nproc_per_node 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import stepscope


def main() -> None:
    out_dir, ranks = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = stepscope.performance_monitor(
        model,
        out_dir=out_dir,
        wait=1,
        warmup=1,
        active=2,
        repeat=1,
        console=False,
        profiled_ranks="all" if ranks == "all" else [int(r) for r in ranks.split(",")],
    )
    losses = []
    with monitor:
        for _ in range(6):
            x = torch.randn(8, 16)
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
            monitor.step()
    report = {"rank": rank, "run_dir": str(monitor.run_dir), "recording": monitor.recording, "losses": losses}
    Path(out_dir, f"report_rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
