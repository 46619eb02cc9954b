"""A tiny deterministic training loop shared by the capture tests."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any


def make_training(seed: int = 0) -> tuple[Any, Any]:
    """(train_step, model): an MLP step returning the loss as a float, same numbers for the same seed."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(seed)

    def train_step() -> float:
        x = torch.randn(16, 32, generator=gen)
        y = torch.randint(0, 4, (16,), generator=gen)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.item()

    return train_step, model


def bare_losses(steps: int) -> list[float]:
    train_step, _ = make_training()
    return [train_step() for _ in range(steps)]


def profiled_run(out: Path, steps: int, **options: Any) -> Path:
    """The run folder of `steps` steps of make_training's loop under a monitor with `options` (its warnings
    silenced)."""
    import stepscope

    train_step, model = make_training()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        monitor = stepscope.performance_monitor(model, out_dir=str(out), **options)
        step = monitor(train_step)
        for _ in range(steps):
            step()
        monitor.close()
    assert monitor.run_dir is not None
    return monitor.run_dir
