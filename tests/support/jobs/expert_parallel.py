"""A tiny MoE-style expert-parallel job on gloo for the expert tests: `torchrun --standalone --nproc_per_node N
tests/support/jobs/expert_parallel.py moe OUT_DIR`.

Each step, every rank routes its tokens to the experts of the other ranks with uneven splits (`send_splits`:
rank r sends `1 + r * world + d` tokens to rank d, so the ranks send and receive different amounts), dispatches them with
`all_to_all_single` (c10d::alltoall_base_), runs its local expert (a Linear) and sends the results back
(combine: the reverse all_to_all_single). Steps 2-3 are recorded on every rank, shapes recorded.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch import nn

import stepscope

HIDDEN = 8
STEPS = 5


def send_splits(rank: int, world: int) -> list[int]:
    """Tokens rank `rank` sends to each rank (its dispatch's input split sizes)."""
    return [1 + rank * world + d for d in range(world)]


def moe(out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    expert = nn.Linear(HIDDEN, HIDDEN)
    send = send_splits(rank, world)
    recv = [send_splits(src, world)[rank] for src in range(world)]
    monitor = stepscope.performance_monitor(
        expert, out_dir=out_dir, wait=1, warmup=1, active=2, repeat=1, record_shapes=True,
        profiled_ranks="all", console=False,
    )  # fmt: skip
    with monitor:
        for _ in range(STEPS):
            tokens = torch.randn(sum(send), HIDDEN)
            routed = torch.empty(sum(recv), HIDDEN)
            dist.all_to_all_single(
                routed, tokens, output_split_sizes=recv, input_split_sizes=send
            )  # dispatch
            out = expert(routed).detach()
            back = torch.empty(sum(send), HIDDEN)
            dist.all_to_all_single(back, out, output_split_sizes=send, input_split_sizes=recv)  # combine
            monitor.step()
    dist.destroy_process_group()


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    {"moe": moe}[sys.argv[1]](sys.argv[2])


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
