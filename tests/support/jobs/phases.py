"""Real CPU jobs for the step and phase definitions, profiled by stepscope.

    python tests/support/jobs/phases.py OUT_DIR JOB

writes one run folder under OUT_DIR and prints its path on the last line. Jobs (asserted in tests/analysis/test_phases.py):

- lightning_cnn:    a Lightning CNN trained with SGD through the stepscope Lightning callback; Lightning runs
                    forward and backward inside `optimizer.step(closure)`
- decorator_loader: the decorator form (`@monitor def train_step(batch)`) fed by a DataLoader whose every sample
                    sleeps 3 ms in the main process (no workers)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

SCHEDULE = {"wait": 2, "warmup": 1, "active": 3, "repeat": 1, "console": False}
STEPS = 8
BATCH = 8
SAMPLE_SLEEP_S = 0.003


def lightning_cnn(out: Path) -> Path:
    import lightning as L
    import torch
    from torch import nn

    from stepscope.integrations.lightning import StepscopeCallback

    class CNN(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(
                nn.Conv2d(3, 16, 3, padding=1),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Conv2d(16, 32, 3, padding=1),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Flatten(),
                nn.Linear(32 * 8 * 8, 10),
            )

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    n = 32 * (STEPS + 2)
    data = torch.utils.data.TensorDataset(torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,)))
    callback = StepscopeCallback(out_dir=str(out), **SCHEDULE)
    trainer = L.Trainer(
        max_steps=STEPS,
        accelerator="cpu",
        devices=1,
        logger=False,
        default_root_dir=str(out),
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=[callback],
    )
    trainer.fit(CNN(), torch.utils.data.DataLoader(data, batch_size=32))
    assert callback.run_dir is not None
    return callback.run_dir


class SlowSamples:
    """A map-style dataset whose every sample sleeps `SAMPLE_SLEEP_S` (I/O-like waiting)."""

    def __init__(self, n: int) -> None:
        import torch

        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 256, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> Any:
        time.sleep(SAMPLE_SLEEP_S)
        return self.x[i], self.y[i]


def decorator_loader(out: Path) -> Path:
    import torch
    from torch import nn

    import stepscope

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    monitor = stepscope.performance_monitor(model, out_dir=str(out), **SCHEDULE)

    @monitor
    def train_step(batch: Any) -> None:
        x, y = batch
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()

    loader = torch.utils.data.DataLoader(SlowSamples(BATCH * STEPS), batch_size=BATCH)
    for batch in loader:
        train_step(batch)
    monitor.close()
    assert monitor.run_dir is not None
    return monitor.run_dir


JOBS = {"lightning_cnn": lightning_cnn, "decorator_loader": decorator_loader}

if __name__ == "__main__":
    import torch

    torch.set_num_threads(1)
    print(JOBS[sys.argv[2]](Path(sys.argv[1])))
