"""The views TensorBoard's profiler plugin had beside its op table: the call stacks that issued the costliest
ops (the user's own frames first), and time and FLOPs by module, as a tree, forward and backward apart."""

from __future__ import annotations

import collections
import re
import sys
from collections.abc import Callable, Sequence

import msgspec

from stepscope.analysis.ops.calls import OpCall
from stepscope.analysis.ops.where import MODULE_PREFIX

__all__ = ["ModuleRow", "StackRow", "module_tree", "top_stacks"]

_INSTANCE = re.compile(r"_\d+$")  # a module frame's instance number (`Linear_12`)
STACK_GROUPS = 5  # op groups (by time) whose stacks are listed
STACKS_PER_GROUP = 3
LIBRARY_FRAMES = 2  # frames shown where a stack has none of the user's own
# the first part of a frame's path that marks a library's frame (besides Python's own modules and any path
# through site-packages): the frameworks a training job runs under
LIBRARIES = frozenset(
    {
        "torch",
        "torchvision",
        "torchaudio",
        "transformers",
        "accelerate",
        "lightning",
        "pytorch_lightning",
        "deepspeed",
        "megatron",
        "apex",
        "diffusers",
        "timm",
        "peft",
        "trl",
        "datasets",
        "tqdm",
        "numpy",
        "triton",
        "flash_attn",
        "xformers",
        "torchtitan",
        "composer",
        "stepscope",
        # what launches a script (stepscope run's own command line is click's)
        "click",
        "typer",
        "hydra",
        "omegaconf",
        "fire",
        "absl",
        "jsonargparse",
        "wandb",
        "ray",
    }
)


class StackRow(msgspec.Struct):
    """One stack that issued calls of one op group."""

    name: str
    shapes: str
    time_us: float
    share: float  # of the group's time
    calls: int
    frames: list[str]  # the user's own frames, outermost first (else the innermost library frames)
    user: bool  # the frames are the user's (False: the stack holds none; library frames instead)


class ModuleRow(msgspec.Struct):
    """A module of the tree: the counted calls inside it (its submodules' included)."""

    path: str  # "Qwen2Model_0/Qwen2DecoderLayer_3"
    name: str
    depth: int
    calls: int
    forward_us: float
    backward_us: float
    flops: float


def is_library(frame: str) -> bool:
    """A frame of Python itself or of a library (torch, transformers, ...), not of the user's code."""
    if frame.startswith(("<", MODULE_PREFIX)):
        return True
    path = frame.split("(", 1)[0].replace("\\", "/")
    if "site-packages/" in path or "dist-packages/" in path or "/lib/python" in path:
        return True
    first = path.lstrip("/").split("/", 1)[0].removesuffix(".py")
    return first in LIBRARIES or first in sys.stdlib_module_names


def top_stacks(
    calls: Sequence[OpCall], key: Callable[[OpCall], tuple[str, str]], groups: Sequence[tuple[str, str]]
) -> list[StackRow]:
    """For each of `groups` (op name, shapes; the costliest first), its stacks by time."""
    wanted = set(groups)
    by_group: dict[tuple[str, str], dict[tuple[str, ...], list[float]]] = collections.defaultdict(
        lambda: collections.defaultdict(lambda: [0.0, 0])
    )
    totals: dict[tuple[str, str], float] = collections.defaultdict(float)
    for call in calls:
        if call.stack is None:
            continue
        k = key(call)
        if k not in wanted:
            continue
        entry = by_group[k][call.stack]
        entry[0] += call.time_us
        entry[1] += 1
        totals[k] += call.time_us
    rows = []
    for k in groups:
        if k not in by_group:
            continue
        merged: dict[tuple[tuple[str, ...], bool], list[float]] = collections.defaultdict(lambda: [0.0, 0])
        for stack, (time_us, n) in by_group[k].items():
            own = [f for f in stack if not is_library(f)]
            frames = (
                tuple(own)
                if own
                else tuple(f for f in stack if not f.startswith(MODULE_PREFIX))[-LIBRARY_FRAMES:]
            )
            merged[(frames, bool(own))][0] += time_us
            merged[(frames, bool(own))][1] += n
        best = sorted(merged.items(), key=lambda kv: -kv[1][0])[:STACKS_PER_GROUP]
        for (frames, user), (time_us, n) in best:
            share = time_us / totals[k] if totals[k] else 0.0
            rows.append(StackRow(k[0], k[1], time_us, share, int(n), list(frames), user))
    return rows


def module_tree(calls: Sequence[OpCall], *, by_type: bool = False) -> list[ModuleRow]:
    """Every module with counted calls inside it, in tree order (a module's children after it, costliest
    first), each with its forward and backward time and FLOPs. `by_type`: a module's instances as one
    (`Qwen2DecoderLayer_0` ... `_23` as `Qwen2DecoderLayer`), the view of a model's repeated blocks."""
    totals: dict[tuple[str, ...], list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    types: dict[tuple[str, ...], tuple[str, ...]] = {}
    for call in calls:
        if not call.module:
            continue
        module = call.module
        if by_type:
            module = types.get(module) or types.setdefault(
                module, tuple(_INSTANCE.sub("", m) for m in module)
            )
        for depth in range(1, len(module) + 1):
            entry = totals[module[:depth]]
            entry[1 if call.backward else 0] += call.time_us
            entry[2] += call.cost.flops or 0.0
            entry[3] += 1
    children: dict[tuple[str, ...], list[tuple[str, ...]]] = collections.defaultdict(list)
    for path in totals:
        children[path[:-1]].append(path)
    rows: list[ModuleRow] = []

    def walk(parent: tuple[str, ...]) -> None:
        for path in sorted(children.get(parent, ()), key=lambda p: -(totals[p][0] + totals[p][1])):
            fwd, bwd, flops, n = totals[path]
            rows.append(ModuleRow("/".join(path), path[-1], len(path) - 1, int(n), fwd, bwd, flops))
            walk(path)

    walk(())
    return rows
