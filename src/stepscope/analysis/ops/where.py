"""Where each counted call was issued: its Python stack, its module, and whether it ran in the backward pass.

- The stack: the `python_function` events around the op on its thread (`with_stack=True` in current traces),
  outermost first; a 2021 trace gives it as the op's `Call stack` argument instead (innermost first).
- The module: the `nn.Module: Linear_3` frames of that stack (torch's Python tracer records them with
  `with_stack=True`; `with_modules=True` alone adds nothing to a chrome trace in torch 2.13), outermost first.
- The backward pass: an op inside an autograd node (`AddmmBackward0`, with the `Sequence number` of the forward
  op that made it) is in the backward pass, and takes the module and the stack of that forward op: the code
  that can change it (its own stack ends in `loss.backward()`).
"""

from __future__ import annotations

import collections
from typing import Any

__all__ = ["MODULE_PREFIX", "Frames"]

MODULE_PREFIX = "nn.Module: "


class Frames:
    """The events of one trace that say where ops were issued, per thread, gathered during the trace's pass."""

    def __init__(self) -> None:
        self.python: dict[Any, list[tuple[float, float, str]]] = collections.defaultdict(list)
        # ops with a sequence number: (ts, end, seq, is an autograd node)
        self.sequenced: dict[Any, list[tuple[float, float, int, bool]]] = collections.defaultdict(list)
        self._names: dict[str, str] = {}

    def python_frame(self, key: Any, ts: float, dur: float, name: str) -> None:
        self.python[key].append((ts, ts + dur, self._names.setdefault(name, name)))

    def sequenced_op(self, key: Any, ts: float, dur: float, seq: int, name: str) -> None:
        self.sequenced[key].append((ts, ts + dur, seq, "Backward" in name))

    def place(self, ops: dict[Any, list[Any]]) -> None:
        """Set each op's `stack`, `module` and `backward` (ops: per thread, each with ts, end and a 2021
        `call_stack` text or None)."""
        modules: dict[int, tuple[str, ...]] = {}  # a forward op's sequence number -> its module
        issued: dict[int, tuple[str, ...]] = {}  # ... -> its stack
        nodes: list[tuple[Any, int]] = []  # (op, sequence number of the autograd node it ran in)
        stacks: dict[tuple[str, ...], tuple[str, ...]] = {}
        for key in set(ops) | set(self.sequenced):
            timeline: list[tuple[float, int, float, Any]] = []
            timeline += [(ts, 0, -end, (end, name)) for ts, end, name in self.python.get(key, ())]
            for ts, end, seq, node in self.sequenced.get(key, ()):
                timeline.append((ts, 1 if node else 2, -end, (end, seq)))
            timeline += [(op.ts, 3, -op.end, op) for op in ops.get(key, ())]
            timeline.sort(key=lambda t: (t[0], t[1], t[2]))
            frames: list[tuple[float, str]] = []
            autograd: list[tuple[float, int]] = []
            for ts, kind, _, item in timeline:
                while frames and frames[-1][0] <= ts:
                    frames.pop()
                while autograd and autograd[-1][0] <= ts:
                    autograd.pop()
                if kind == 0:
                    frames.append(item)
                elif kind == 1:
                    autograd.append(item)
                elif kind == 2:
                    # An op that makes no autograd node records the number the next one will take: the op
                    # that made node N is the last forward op with N (ops after it record N + 1)
                    modules[item[1]] = _module(frames)
                    if frames:
                        names = tuple(name for _, name in frames)
                        issued[item[1]] = stacks.setdefault(names, names)
                else:
                    if frames:
                        names = tuple(name for _, name in frames)
                        item.stack = stacks.setdefault(names, names)
                    elif item.call_stack:
                        names = tuple(reversed([f.strip() for f in item.call_stack.split(";") if f.strip()]))
                        item.stack = stacks.setdefault(names, names)
                    item.module = _module(frames) or None
                    if autograd:
                        item.backward = True
                        nodes.append((item, autograd[-1][1]))
        for op, seq in nodes:
            op.module = modules.get(seq) or op.module
            op.stack = issued.get(seq) or op.stack


def _module(frames: list[tuple[float, str]]) -> tuple[str, ...]:
    return tuple(name[len(MODULE_PREFIX) :] for _, name in frames if name.startswith(MODULE_PREFIX))
