"""Components for `stepscope bench examples/components.yaml`: two implementations of RMSNorm."""

from __future__ import annotations

import torch


class RMSNorm(torch.nn.Module):
    """RMSNorm over the last dimension; `impl` "naive" spells it out in tensor ops, "fused" calls
    torch.nn.functional.rms_norm."""

    def __init__(self, dim: int, eps: float = 1e-6, impl: str = "naive") -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.impl = impl

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.impl == "fused":
            return torch.nn.functional.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
