"""A gloo DDP job for the distributed-analysis tests, with an optional straggler.

Run with torchrun --standalone --nproc_per_node N straggler.py OUT_DIR WHERE SLOW_RANK DELAY_MS, where
WHERE is `data` (the slow rank's DataLoader sleeps DELAY_MS per batch), `forward` (its model's forward
sleeps), `op` (after its optimizer step the slow rank multiplies matrices for DELAY_MS: time in no annotated
phase, spent in one op, `aten::mm`), `none` (every rank's forward sleeps DELAY_MS: no rank slower), or `idle` (no model: every rank sleeps DELAY_MS, then all-reduces and all-gathers, so the
collectives find the CPUs free even with more ranks than cores). Every step runs one DDP all-reduce of the gradients and one all_gather of 256 floats; each
rank writes what it issued to OUT_DIR/issued_rank{R}.json.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

import stepscope

STEPS = 8
GATHER = 256


class Slow(nn.Module):
    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
        self.delay_s = delay_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.net(x)


def main() -> None:
    out_dir, where, slow_rank, delay_ms = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    # `none`: every rank's forward sleeps DELAY_MS alike (a step of realistic length, nobody slower)
    slow = (rank == slow_rank and where != "idle") or where == "none"
    delay_s = delay_ms / 1e3 if slow else 0.0

    def collate(batch: list[torch.Tensor]) -> torch.Tensor:
        if where == "data" and delay_s:
            time.sleep(delay_s)
        return torch.stack(batch)

    data = [torch.randn(32) for _ in range(8 * STEPS)]
    loader = DataLoader(data, batch_size=8, collate_fn=collate)
    model = nn.parallel.DistributedDataParallel(Slow(delay_s if where in ("forward", "none") else 0.0))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    monitor = stepscope.performance_monitor(
        model,
        out_dir=out_dir,
        wait=1,
        warmup=1,
        active=STEPS - 2,
        repeat=1,
        record_shapes=True,
        console=False,
        profiled_ranks="all",
    )
    square = torch.randn(128, 128)
    gathered = [torch.zeros(GATHER) for _ in range(dist.get_world_size())]
    with monitor:
        for x in loader:
            if where == "idle":
                time.sleep(delay_ms / 1e3)
                for p in model.parameters():
                    dist.all_reduce(p.detach())
            else:
                loss = model(x).square().mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
                if where == "op" and delay_s:
                    busy_until = time.perf_counter() + delay_s
                    while time.perf_counter() < busy_until:
                        torch.mm(square, square)
            dist.all_gather(gathered, torch.full((GATHER,), float(rank)))
            monitor.step()
    params = sum(p.numel() for p in model.parameters())
    issued: dict[str, Any] = {
        "run_dir": str(monitor.run_dir),
        "traced_steps": STEPS - 2,
        "all_reduce_bytes_per_step": params * 4,
        "all_gather_bytes_per_step": GATHER * 4,
    }
    Path(out_dir, f"issued_rank{rank}.json").write_text(json.dumps(issued))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
