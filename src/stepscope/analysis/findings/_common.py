"""Helpers the families of rules share: figures in ms and %, the actions per phase (and for Python), a union of
phases."""

from __future__ import annotations

import numpy as np

from stepscope.analysis import intervals as iv
from stepscope.units import fmt_pct, short_name


def ms(ns: float) -> float:
    return round(ns / 1e6, 3)


PHASE_ACTIONS = {
    "optimizer": "use a fused optimizer (fused=True or foreach=True) or fewer, larger parameter tensors",
    "forward": "cut the CPU work per kernel in the forward pass (torch.compile, CUDA graphs, larger batches)",
    "backward": "cut the CPU work of the backward pass (torch.compile, CUDA graphs, fewer hooks)",
    "other": "move the Python work between the phases (logging, metrics, .item(), checkpoints) out of the "
    "step or overlap it with GPU work",
}


# A phase (or a stretch the host holds the GPU in) whose time is at least this share outside any torch op is
# Python's: the advice is to find that Python, not to make its ops cheaper.
OUTSIDE_OPS_MIN_SHARE = 0.5


def python_action(where: str) -> str:
    """The action for time that is Python in `where` (no torch op runs)."""
    return (
        f"find the Python in {where} with a sampling profiler (the monitor's option python_sampling=True, or "
        "py-spy record) and vectorise it, run it less often or move it out of the step"
    )


# A name in a finding's message (a templated kernel's runs to hundreds of characters) is shortened to this many
# characters (units.short_name); the evidence keeps it in full.
NAME_WIDTH = 80


def code_name(name: str) -> str:
    """`name` as a finding's message shows it: shortened to NAME_WIDTH characters."""
    return short_name(name, NAME_WIDTH)


def all_of(unions: dict[str, iv.Intervals]) -> iv.Intervals:
    starts = np.concatenate([u[0] for u in unions.values()]) if unions else np.zeros(0, dtype=np.int64)
    ends = np.concatenate([u[1] for u in unions.values()]) if unions else np.zeros(0, dtype=np.int64)
    return iv.merge(starts, ends)


fmt_p = fmt_pct
