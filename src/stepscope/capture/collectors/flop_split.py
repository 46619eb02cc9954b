"""Which module did which FLOPs of the counted step: forward FLOPs per module, backward FLOPs as one figure.

FlopCounterMode charges an op to every module its ModuleTracker holds current. In the forward that set is exact
(module pre/post hooks nest), but in the backward it follows gradient hooks, which fire in autograd's order, not
the modules' nesting: a module whose output is its input (Dropout with p=0 or in eval, Identity) enters on its
output's gradient and never leaves, and collects the rest of the backward (measured on a 2-layer
TransformerEncoder with dropout=0: `layers.1.dropout2` 15.2 MFLOP, its own layer 12.6). Nothing in the backward
says reliably which module an op belongs to, so none is charged with it: the backward is one figure.

A forward op goes to the innermost module of the model being called, and a module's figure is its own FLOPs
plus its descendants' (so a child never exceeds its parent, and identical modules get identical FLOPs). Modules
are named by identity in the model (`named_modules`), not after whichever module ran first: under Lightning,
`training_step` calls `self.net` and the LightningModule's own forward never runs.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from stepscope.capture.collectors._instrument import unwrap
from stepscope.runfolder.payloads import ModuleFlops


@dataclass
class ModuleBook:
    """Names of modules: model-relative (`""` is the model), or, without a model, rooted at the class of each
    outermost module called (`Sequential`, `Sequential.0`)."""

    model_type: str | None  # None: no model was given
    names: dict[int, str]  # id(module) -> name
    types: dict[str, str]  # name -> class name
    order: dict[str, int]  # name -> position in named_modules()
    held: list[Any]  # the modules named on the fly, kept alive so that their ids stay theirs

    @classmethod
    def of(cls, model: Any) -> ModuleBook:
        model = unwrap(model)
        if model is None or not hasattr(model, "named_modules"):
            return cls(None, {}, {}, {}, [])
        book = cls(type(model).__name__, {}, {}, {}, [])
        book._add(model, "")
        return book

    def name_of(self, module: Any) -> str | None:
        """The module's name; None for a module outside the model."""
        name = self.names.get(id(module))
        if name is None and self.model_type is None:
            root, k = type(module).__name__, 2
            while root in self.types:
                root, k = f"{type(module).__name__}#{k}", k + 1
            self._add(module, root)
            self.held.append(module)
            name = root
        return name

    def _add(self, module: Any, root: str) -> None:
        for path, sub in module.named_modules():
            name = f"{root}.{path}" if root and path else root or path
            if id(sub) not in self.names:
                self.names[id(sub)] = name
                self.types[name] = type(sub).__name__
                self.order[name] = len(self.order)

    def label(self, name: str) -> str:
        return f"{self.model_type} (model)" if self.model_type is not None and name == "" else name

    def depth(self, name: str) -> int:
        """1 for the model (or an outermost module without one), 2 for its children, ..."""
        if self.model_type is None:
            return name.count(".") + 1
        return 1 if name == "" else name.count(".") + 2

    def ancestors(self, name: str) -> list[str]:
        """`name` and every module above it, innermost first (`a.b` -> `a.b`, `a`, and `""` with a model)."""
        out = [name]
        while "." in name:
            name = name.rsplit(".", 1)[0]
            out.append(name)
        if self.model_type is not None and name != "":
            out.append("")
        return out


@dataclass
class FlopSplit:
    """The counted step's FLOPs by pass: forward per module (own FLOPs), forward outside the model, backward."""

    own: dict[str, Counter[str]]  # module name -> op -> forward FLOPs done inside it and no child
    outside: Counter[str]  # forward FLOPs outside every module of the model
    backward: Counter[str]  # FLOPs done while autograd runs a backward (recomputed forwards included)

    def module_rows(self, book: ModuleBook) -> list[ModuleFlops]:
        """One row per module that did forward FLOPs (its own and its descendants'), in the model's order."""
        totals: dict[str, Counter[str]] = {}
        for name, ops in self.own.items():
            for owner in book.ancestors(name):
                totals.setdefault(owner, Counter()).update(ops)
        rows = [
            ModuleFlops(
                name=name,
                label=book.label(name),
                type=book.types.get(name),
                depth=book.depth(name),
                flops=sum(ops.values()),
                ops=dict(sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))),
            )
            for name, ops in totals.items()
            if sum(ops.values()) > 0
        ]
        rows.sort(key=lambda r: (book.order.get(r.name, len(book.order)), r.name))
        return rows


def split_mode(counter: Any, book: ModuleBook) -> Any:
    """A dispatch mode, entered inside `counter` (a FlopCounterMode), that splits what it counts (FlopSplit in
    `.split`) by pass and, in the forward, by module. Per op it reads the counter's total before and after the
    op runs: the difference is that op's FLOPs as FlopCounterMode counted them (decompositions included)."""
    import torch
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
    from torch.utils._python_dispatch import TorchDispatchMode

    in_backward = torch._C._current_graph_task_id  # -1 outside autograd's backward

    class SplitMode(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.split = FlopSplit({}, Counter(), Counter())
            self._stack: list[tuple[Any, str | None]] = []  # modules being called, outermost first
            self._seen: Counter[Any] = Counter()  # the counter's FLOPs per op so far
            self._handles: list[Any] = []

        def __enter__(self) -> Any:
            self._handles = [
                register_module_forward_pre_hook(self._called),
                register_module_forward_hook(self._returned, always_call=True),
            ]
            return super().__enter__()

        def __exit__(self, *exc: Any) -> Any:
            for handle in self._handles:
                handle.remove()
            self._handles = []
            return super().__exit__(*exc)

        def _called(self, module: Any, args: Any) -> None:
            self._stack.append((module, book.name_of(module)))

        def _returned(self, module: Any, args: Any, output: Any) -> None:
            # (from the top: a forward that raised inside and was caught left its entry above ours)
            for i in range(len(self._stack) - 1, -1, -1):
                if self._stack[i][0] is module:
                    del self._stack[i:]
                    return

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            before = counter.get_total_flops()
            out = func(*args, **(kwargs or {}))
            if counter.get_total_flops() != before:
                self._charge(self._new_counts())
            return out

        def _new_counts(self) -> Counter[str]:
            now = counter.get_flop_counts().get("Global", {})
            new: Counter[str] = Counter()
            for op, n in now.items():
                if n != self._seen[op]:
                    new[str(op)] = n - self._seen[op]
                    self._seen[op] = n
            return new

        def _charge(self, new: Counter[str]) -> None:
            if in_backward() != -1:
                self.split.backward.update(new)
                return
            name = next((name for _, name in reversed(self._stack) if name is not None), None)
            if name is None:
                self.split.outside.update(new)
            else:
                self.split.own.setdefault(name, Counter()).update(new)

    return SplitMode()
