"""A plain training script with no stepscope in it: profile it with

    stepscope run --wait 1 --warmup 1 --active 3 examples/plain_train.py --steps 20
    stepscope run --nproc-per-node 2 examples/plain_train.py --steps 20      # DDP on gloo, 2 processes

It trains a small MLP on random data; under torchrun (WORLD_SIZE set) it uses DDP on gloo.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--exit-code", type=int, default=0, help="exit with this status at the end")
    parser.add_argument("--fail", action="store_true", help="raise an error after training")
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds of extra work per step")
    args = parser.parse_args()
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        import torch.distributed as dist

        dist.init_process_group("gloo")
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(args.steps * 16, 64), torch.randn(args.steps * 16, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=16, num_workers=args.workers)
    model: torch.nn.Module = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)
    )
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = 0
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps += 1
        if args.sleep:
            time.sleep(args.sleep)
    rank = int(os.environ.get("RANK", "0"))
    print(f"rank {rank}: trained {steps} steps, argv {sys.argv[1:]}, module {__name__}")
    if distributed:
        torch.distributed.destroy_process_group()
    if args.fail:
        raise RuntimeError("failing on purpose (--fail)")
    return args.exit_code


if __name__ == "__main__":
    sys.exit(main())
