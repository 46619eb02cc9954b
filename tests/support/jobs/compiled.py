"""A real torch.compile job for tests/analysis/test_whatif_events.py: `python tests/support/jobs/compiled.py OUT.json`.

A small MLP compiled with the aot_eager backend (no C++ compiler needed), trained 4 steps under torch.profiler
(wait 1, warmup 1, active 2); between the compiled forward and backward, uncompiled host work (a Python loop)."""

from __future__ import annotations

import sys

import torch


def main(out: str) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))
    compiled = torch.compile(model, backend="aot_eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256)

    def train_step() -> None:
        loss = compiled(x).square().mean()
        with torch.profiler.record_function("eager_work"):
            y = x
            for _ in range(20):
                y = torch.tanh(y @ y.T[:, :256] * 1e-3)
        loss.backward()
        opt.step()
        opt.zero_grad()

    train_step()  # compiles
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=2)
    with torch.profiler.profile(schedule=schedule) as prof:
        for _ in range(4):
            train_step()
            prof.step()
    prof.export_chrome_trace(out)


if __name__ == "__main__":
    main(sys.argv[1])
