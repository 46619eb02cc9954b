"""An unmodified DDP training script (no stepscope in it) for the tests of `stepscope run` on a gloo job:
`stepscope run --nproc-per-node 4 [--profiled-ranks all] tests/support/jobs/ddp.py --slow-rank 2 --delay-ms 60`.

A 256-512-512-10 MLP under DDP. With DDP's default buckets (the first one is 1 MB) the gradients are reduced in
two buckets, whose all-reduces gloo runs concurrently on two threads; `--bucket-cap-mb 100` makes it one. The
slow rank sleeps `--delay-ms` in its DataLoader's `collate_fn`, so every other rank waits for it in the
all-reduces; `--sleep-ms` makes every rank sleep that long after each optimizer step. Each rank writes what it did to `--report-dir`/ddp_rank{R}.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

WIDTHS = (256, 512, 512, 10)
BATCH = 32


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--slow-rank", type=int, default=2)
    parser.add_argument("--delay-ms", type=float, default=60.0)
    parser.add_argument("--bucket-cap-mb", type=float, default=None, help="DDP's bucket cap (default: DDP's)")
    parser.add_argument("--sleep-ms", type=float, default=0.0, help="every rank sleeps this after each step")
    parser.add_argument("--report-dir", default=".")
    return parser.parse_args()


def main() -> None:
    args = parse()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    delay_s = args.delay_ms / 1e3 if rank == args.slow_rank else 0.0

    def collate(batch: list[torch.Tensor]) -> torch.Tensor:
        if delay_s:
            time.sleep(delay_s)
        return torch.stack(batch)

    data = [torch.randn(WIDTHS[0]) for _ in range(BATCH * args.steps)]
    loader = DataLoader(data, batch_size=BATCH, collate_fn=collate)
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(itertools.pairwise(WIDTHS)):
        layers.append(nn.Linear(n_in, n_out))
        if i < len(WIDTHS) - 2:
            layers.append(nn.ReLU())
    options = {} if args.bucket_cap_mb is None else {"bucket_cap_mb": args.bucket_cap_mb}
    model = nn.parallel.DistributedDataParallel(nn.Sequential(*layers), **options)  # type: ignore[arg-type]
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x in loader:
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if args.sleep_ms:
            time.sleep(args.sleep_ms / 1e3)  # Python outside any op, on every rank alike
    report = {
        "rank": rank,
        "steps": args.steps,
        "delay_ms": delay_s * 1e3,
        "bucket_cap_mb": args.bucket_cap_mb,
    }
    Path(args.report_dir, f"ddp_rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
