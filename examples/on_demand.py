"""A long job that records nothing until asked:

    python examples/on_demand.py --steps 100000 &
    stepscope trigger stepscope_runs --active 3          # or: kill -USR2 <pid>

Every profiled rank records the next window (warmup, then the active steps) from the same step.
"""

from __future__ import annotations

import argparse
import time

import torch

import stepscope


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--out-dir", default="stepscope_runs")
    parser.add_argument("--sleep", type=float, default=0.01, help="seconds of extra work per step")
    args = parser.parse_args()
    model = torch.nn.Linear(256, 256)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    monitor = stepscope.performance_monitor(
        model, out_dir=args.out_dir, on_demand=True, trigger_poll_steps=5, warmup=1, active=3, console=False
    )
    with monitor:
        print(f"run folder: {monitor.run_dir}", flush=True)
        for _ in range(args.steps):
            loss = model(torch.randn(64, 256)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            time.sleep(args.sleep)
            monitor.step()


if __name__ == "__main__":
    main()
