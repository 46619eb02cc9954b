"""Helpers the families of rules share: figures in ms and %, the actions per phase, a union of phases."""

from __future__ import annotations

import numpy as np

from stepscope.analysis import intervals as iv
from stepscope.units import fmt_pct


def ms(ns: float) -> float:
    return round(ns / 1e6, 3)


PHASE_ACTIONS = {
    "optimizer": "use a fused optimizer (fused=True or foreach=True) or fewer, larger parameter tensors",
    "forward": "cut the CPU work per kernel in the forward pass (torch.compile, CUDA graphs, larger batches)",
    "backward": "cut the CPU work of the backward pass (torch.compile, CUDA graphs, fewer hooks)",
    "other": "move the Python work between the phases (logging, metrics, .item(), checkpoints) out of the "
    "step or overlap it with GPU work",
}


def all_of(unions: dict[str, iv.Intervals]) -> iv.Intervals:
    starts = np.concatenate([u[0] for u in unions.values()]) if unions else np.zeros(0, dtype=np.int64)
    ends = np.concatenate([u[1] for u in unions.values()]) if unions else np.zeros(0, dtype=np.int64)
    return iv.merge(starts, ends)


fmt_p = fmt_pct
