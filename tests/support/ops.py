"""Ops run on CPU under torch.profiler (record_shapes) and counted independently: torch's FLOP counter for the
FLOPs, and a dispatch mode that adds up each aten op's tensors for the bytes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


def record(fn: Callable[[], Any], path: Path, *, with_stack: bool = False) -> Path:
    """`fn` run once (a warm-up) and then under torch.profiler with record_shapes (and its Python stacks, with
    `with_stack`); its chrome trace at `path`."""
    import torch

    fn()
    acts = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=acts, record_shapes=True, with_stack=with_stack) as prof:
        fn()
    prof.export_chrome_trace(str(path))
    return path


def counted_flops(fn: Callable[[], Any]) -> int:
    """The FLOPs torch.utils.flop_counter counts for `fn`."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as mode:
        fn()
    return int(mode.get_total_flops())


def tensor_bytes(fn: Callable[[], Any], ops: set[str]) -> float:
    """The bytes of the tensors each call of `ops` (aten names, `aten::add`) takes and returns, as the dispatcher
    sees them: the least it must read and write."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    total = [0.0]

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            name = "aten::" + func.__name__.split(".")[0]
            if name in ops:
                for t in tree_leaves((args, kwargs, out)):
                    if isinstance(t, torch.Tensor) and t.dim() > 0:
                        total[0] += t.numel() * t.element_size()
            return out

    with Count():
        fn()
    return total[0]
