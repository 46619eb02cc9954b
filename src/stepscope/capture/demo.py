"""The bundled demo: a small MLP trained on synthetic data on the CPU, profiled by stepscope."""

from __future__ import annotations

from pathlib import Path
from typing import Any

DEMO_SIZES = {"in_features": 512, "hidden": 512, "layers": 4, "classes": 10, "batch": 64}


def build_demo(seed: int = 0) -> tuple[Any, Any, Any]:
    """The demo model, its optimizer and a batch maker (synthetic data, fixed seed)."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    s = DEMO_SIZES
    layers: list[nn.Module] = []
    width = s["in_features"]
    for _ in range(s["layers"]):
        layers += [nn.Linear(width, s["hidden"]), nn.ReLU()]
        width = s["hidden"]
    layers.append(nn.Linear(width, s["classes"]))
    model = nn.Sequential(*layers)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(seed)

    def make_batch() -> tuple[Any, Any]:
        x = torch.randn(s["batch"], s["in_features"], generator=generator)
        y = torch.randint(0, s["classes"], (s["batch"],), generator=generator)
        return x, y

    return model, optimizer, make_batch


def make_train_step(model: Any, optimizer: Any, monitor: Any = None) -> Any:
    """One SGD step; with a monitor, forward/backward/optimizer are named regions."""
    import contextlib

    import torch.nn.functional as F

    def region(name: str) -> Any:
        return monitor.region(name) if monitor is not None else contextlib.nullcontext()

    def train_step(batch: tuple[Any, Any]) -> float:
        x, y = batch
        with region("forward"):
            loss = F.cross_entropy(model(x), y)
        with region("backward"):
            loss.backward()
        with region("optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    return train_step


def run_demo(out_dir: str | Path = "stepscope_runs", steps: int = 20, **options: Any) -> Any:
    """Train the demo for `steps` steps under a monitor (decorator form); returns the monitor."""
    import torch

    from stepscope.capture.monitor import performance_monitor

    torch.set_num_threads(1)
    model, optimizer, make_batch = build_demo()
    # FLOPs counted at step 4, a wait step: TFLOP/s comes from the other untraced steps (CPU: no MFU).
    defaults: dict[str, Any] = {"wait": 5, "warmup": 2, "active": 3, "repeat": 2, "flop_counter_step": 4}
    defaults.update(options)
    monitor = performance_monitor(model, out_dir=str(out_dir), **defaults)
    step = monitor(make_train_step(model, optimizer, monitor))
    for _ in range(steps):
        step(make_batch())
    monitor.close()
    return monitor


def train_plain(steps: int = 20) -> None:
    """The demo's training without a monitor (what `stepscope estimate -m stepscope.capture.demo` runs)."""
    import torch

    torch.set_num_threads(1)
    model, optimizer, make_batch = build_demo()
    step = make_train_step(model, optimizer)
    for _ in range(steps):
        step(make_batch())


if __name__ == "__main__":
    import sys

    train_plain(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
