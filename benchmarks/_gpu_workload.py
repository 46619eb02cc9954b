"""The workloads of `gpu_check.py`: a small causal transformer trained in bf16 autocast with AdamW and a
DataLoader, and a square bf16 GEMM of known size. Sizes shrink for the dry (CPU) mode."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Sizes:
    vocab: int
    d_model: int
    heads: int
    layers: int
    seq: int
    batch: int
    workers: int  # DataLoader worker processes
    gemm: int  # M = N = K of the GEMM
    gemm_reps: int  # GEMMs per timed step
    overhead_batch: int  # batch of the overhead phase (GPU: large enough that the step is GPU-bound)


GPU_SIZES = Sizes(
    vocab=8192, d_model=1024, heads=16, layers=4, seq=512, batch=16, workers=2, gemm=8192, gemm_reps=8,
    overhead_batch=64,
)  # fmt: skip
CPU_SIZES = Sizes(
    vocab=512,
    d_model=64,
    heads=4,
    layers=2,
    seq=32,
    batch=4,
    workers=0,
    gemm=512,
    gemm_reps=4,
    overhead_batch=4,
)


class TinyLM(nn.Module):
    """A decoder-only language model: embedding, pre-norm causal transformer blocks, a vocabulary head."""

    def __init__(self, s: Sizes) -> None:
        super().__init__()
        self.embed = nn.Embedding(s.vocab, s.d_model)
        layer = nn.TransformerEncoderLayer(
            s.d_model, s.heads, 4 * s.d_model, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, s.layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(s.d_model)
        self.head = nn.Linear(s.d_model, s.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        seq = tokens.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(seq, device=tokens.device)
        hidden = self.blocks(self.embed(tokens), mask=mask, is_causal=True)
        return self.head(self.norm(hidden))


@dataclass
class Training:
    model: TinyLM
    optimizer: torch.optim.Optimizer
    loader: torch.utils.data.DataLoader
    device: torch.device


def build_training(s: Sizes, device: torch.device, steps: int, seed: int = 0) -> Training:
    torch.manual_seed(seed)
    model = TinyLM(s).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    tokens = torch.randint(
        0, s.vocab, (s.batch * steps, s.seq + 1), generator=torch.Generator().manual_seed(seed)
    )
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(tokens),
        batch_size=s.batch,
        shuffle=True,
        num_workers=s.workers,
        pin_memory=device.type == "cuda",
        drop_last=True,
    )
    return Training(model, optimizer, loader, device)


def batches(loader: torch.utils.data.DataLoader) -> Iterator[Any]:
    """The loader's batches, epoch after epoch."""
    for _ in itertools.count():
        yield from loader


StepHook = Callable[[int], None]


def run_monitored(monitor: Any, train_step: Callable[[Any], float], t: Training, steps: int) -> Path:
    """`steps` of `train_step` under `monitor` (closed after them, also on an error); its run folder."""
    step = monitor(train_step)
    feed = batches(t.loader)
    try:
        for _ in range(steps):
            step(next(feed))
    finally:
        monitor.close()
    assert monitor.run_dir is not None
    return Path(monitor.run_dir)


def make_train_step(
    t: Training,
    monitor: Any = None,
    before: StepHook | None = None,
    after: StepHook | None = None,
    optimizer_step: bool = True,
) -> Callable[[Any], float]:
    """One optimizer step in bf16 autocast; forward/backward/optimizer are named regions under a monitor.
    `before`/`after` see the step index, inside the step (where a probe reads CUDA memory peaks).
    `optimizer_step=False`: the same step without the optimizer's update (its gradients still set to None), the
    change whose effect `stepscope whatif --scale optimizer=0` predicts."""
    counter = itertools.count()

    def region(name: str) -> Any:
        return monitor.region(name) if monitor is not None else contextlib.nullcontext()

    def train_step(batch: Any) -> float:
        index = next(counter)
        if before is not None:
            before(index)
        tokens = batch[0].to(t.device, non_blocking=True)
        with region("forward"), torch.autocast(t.device.type, dtype=torch.bfloat16):
            logits = t.model(tokens[:, :-1])
            loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        with region("backward"):
            loss.backward()
        with region("optimizer"):
            if optimizer_step:
                t.optimizer.step()
            t.optimizer.zero_grad(set_to_none=True)
        value = loss.item()  # a step ends when its GPU work has: what a training loop that logs its loss does
        if after is not None:
            after(index)
        return value

    return train_step


@dataclass
class Gemm:
    """`reps` square bf16 products of size n per call, waited for; 2*n^3 FLOPs each."""

    n: int
    reps: int
    device: torch.device

    def __post_init__(self) -> None:
        gen = torch.Generator(device=self.device).manual_seed(0)
        self.a = torch.randn(self.n, self.n, device=self.device, dtype=torch.bfloat16, generator=gen)
        self.b = torch.randn(self.n, self.n, device=self.device, dtype=torch.bfloat16, generator=gen)

    @property
    def flops(self) -> int:
        return 2 * self.n**3 * self.reps

    def __call__(self) -> None:
        for _ in range(self.reps):
            self.a @ self.b  # the product is the work
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
