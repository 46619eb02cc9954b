"""Profile a Lightning fit with one line: `callbacks=[StepscopeCallback(...)]`.

    python examples/lightning_train.py ROOT_DIR [--devices 2]     # 2: the DDP strategy, 2 processes on gloo

A small regression model trains on the CPU. The run folder goes to ROOT_DIR/stepscope/<run>; the headline
numbers go to the trainer's loggers (here a CSVLogger in ROOT_DIR).
"""

from __future__ import annotations

import argparse

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger

from stepscope.integrations.lightning import StepscopeCallback


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root_dir")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--max-steps", type=int, default=12)
    parser.add_argument("--grad-accum", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    size = args.max_steps * args.grad_accum * 8 * args.devices
    data = torch.utils.data.TensorDataset(torch.randn(size, 32), torch.randn(size, 1))
    stepscope = StepscopeCallback(wait=2, warmup=1, active=3, profiled_ranks="all", console=False)
    trainer = L.Trainer(
        max_steps=args.max_steps,
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        accumulate_grad_batches=args.grad_accum,
        logger=CSVLogger(args.root_dir),
        default_root_dir=args.root_dir,
        log_every_n_steps=1,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=[stepscope],
    )
    trainer.fit(Regression(), torch.utils.data.DataLoader(data, batch_size=8))
    if trainer.is_global_zero:
        print(f"stepscope run folder: {stepscope.run_dir}")


if __name__ == "__main__":
    main()
