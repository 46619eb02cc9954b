"""The modelled op calls of one trace file, each with its cost and the time it took.

One pass over the file's events (`read.event_stream`, a batch at a time, each event's args decoded only where
read) keeps only what the model needs: the
ops of a modelled family with their recorded inputs, the runtime's launches and the device's kernels, copies and
fills by correlation id. Then, per thread, the ops are nested by time:

- an op is counted when it has a cost and no op of its family inside it has one (`aten::linear` is counted as
  the `aten::mm` or `aten::addmm` it calls; an attention that runs as products, as those products);
- its time is the device time of the work launched inside it (kernels, copies, fills), or on a trace without
  device work its own wall time (a CPU job).

A convolution whose recorded arguments do not give its output size (2021 traces record no stride or padding)
takes the output of its layer's backward (same input and weight shapes) where the trace has one.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import msgspec

from stepscope.analysis.ops.families import COMPUTE_FAMILIES, CONV_BACKWARDS, family_of
from stepscope.analysis.ops.missing import NO_WORK, lacks, unmodelled
from stepscope.analysis.ops.model import Cost, OpInputs, conv_backward_shapes, conv_forward_shapes, cost_of
from stepscope.analysis.ops.where import Frames
from stepscope.analysis.read.event_stream import EventPieces
from stepscope.devices import name_by_properties

__all__ = ["OpCall", "TraceOps", "read_calls"]

OP_CATEGORIES = frozenset({"cpu_op", "Operator"})
LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "Runtime", "cuda_driver"})
DEVICE_CATEGORIES = frozenset({"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"})
STEP_PREFIX = "ProfilerStep#"
STEP_CATEGORIES = frozenset({"cpu_op", "Operator", "user_annotation"})
_HOST = ("HtoD", "DtoH", "Pageable", "Pinned")  # a copy between the host and the device
# the parts of a 2021 convolution backward: which gradients it computed (its output mask is not recorded)
_CONV_PARTS = ("_backward_input", "_backward_weight")


class OpCall(msgspec.Struct):
    """One counted call: its op, recorded inputs, cost, and time (device time on a GPU trace, else wall)."""

    name: str
    inputs: OpInputs
    cost: Cost
    time_us: float
    kernels: int  # device activities launched inside it (0 on a CPU trace)
    stack: tuple[str, ...] | None = None  # the Python frames it was issued from, outermost first
    module: tuple[str, ...] | None = (
        None  # its nn.Module path (from the stack's module frames), outermost first
    )
    backward: bool = False  # it ran inside an autograd node


class TraceOps(msgspec.Struct):
    """What one trace file gives the op model."""

    path: str
    rank: int | None  # distributedInfo's rank, where the file gives one
    device: str | None  # the device its kernels ran on (deviceProperties' name); None: no device work
    device_memory: int | None
    steps: int  # ProfilerStep ranges in the file (0: none)
    step_us: list[tuple[str, float]]  # each ProfilerStep range and its duration
    device_us: float  # the device's kernels, copies and fills, all of them (0: a CPU trace)
    unlaunched_us: float  # ... those whose launch the trace does not hold (queued before it began)
    calls: list[OpCall]
    shaped: int  # ops with recorded inputs (0: record_shapes was off)
    shaped_names: dict[str, int]  # the commonest of them, by name (what a trace without a counted op holds)
    unmodelled: dict[str, int]  # the commonest ops of no modelled family (views and allocations aside)
    python_frames: int  # python_function events (0: with_stack was off)
    uncounted: dict[str, int]  # modelled ops left without a cost, by name (what they lacked is in `missing`)
    missing: dict[str, str]


class _Op:
    __slots__ = (
        "backward",
        "call_stack",
        "children",
        "cost",
        "covered",
        "device_us",
        "dur",
        "end",
        "holds_counted",
        "host",
        "inner_us",
        "inputs",
        "kernels",
        "module",
        "name",
        "stack",
        "ts",
    )

    def __init__(self, name: str, ts: float, dur: float, inputs: OpInputs) -> None:
        self.name, self.ts, self.dur, self.end, self.inputs = name, ts, dur, ts + dur, inputs
        self.cost: Cost | None = None
        self.covered = False
        self.device_us = 0.0
        self.kernels = 0
        self.host = False
        self.inner_us = 0.0  # wall time of the counted ops of other families inside it
        self.holds_counted = False  # (an op without a cost) counted ops run inside it: its work is theirs
        self.children: set[str] | None = None
        self.call_stack: str | None = None  # a 2021 trace's `Call stack` argument
        self.stack: tuple[str, ...] | None = None
        self.module: tuple[str, ...] | None = None
        self.backward = False


class _Event(msgspec.Struct):
    """An event as the op model reads it: its args left as JSON text, decoded only for the ops, launches and
    device work that need them (most events of a trace with stacks are Python frames, whose args it never reads)."""

    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: msgspec.Raw = msgspec.Raw(b"null")  # (no union: msgspec decodes a Raw only on its own)


_EVENTS = msgspec.json.Decoder(list[_Event])


def read_calls(path: str | Path) -> TraceOps:
    """The counted op calls of the trace at `path` (InputError when it cannot be read as a trace)."""
    pieces = EventPieces(path, decoder=_EVENTS)
    found = _Pass()
    for piece in pieces:
        events = piece.events if piece.typed else [_plain(e) for e in piece.events if isinstance(e, dict)]
        for e in events:
            if e.ph == "X":
                found.take(e)
    head = {**pieces.head, **pieces.tail}
    _nest(found.ops, found.marks, found.launches, found.device, found.host)
    found.frames.place(found.ops)
    calls, uncounted, missing = _count(found.ops, bool(found.device))
    name, memory = _device(head, found.device_ids)
    return TraceOps(
        path=str(path),
        rank=_rank(head),
        device=name if found.device else None,
        device_memory=memory if found.device else None,
        steps=found.steps,
        step_us=found.step_us,
        device_us=found.device_us,
        unlaunched_us=found.unlaunched_us(),
        calls=calls,
        shaped=found.shaped,
        shaped_names=dict(found.shaped_names.most_common(3)),
        unmodelled=unmodelled(found.ops, found.unmodelled_spans),
        python_frames=found.python,
        uncounted=uncounted,
        missing=missing,
    )


def _plain(e: dict[str, Any]) -> _Event:
    """An event of a piece that did not fit _Event (some event there is no object) as one."""
    args = e.get("args")
    fields = {k: e.get(k) for k in ("ph", "cat", "name", "pid", "tid", "ts", "dur")}
    return _Event(**fields, args=msgspec.Raw(msgspec.json.encode(args)))


def _args(e: _Event) -> dict[str, Any]:
    try:
        args = msgspec.json.decode(e.args)
    except msgspec.DecodeError:
        return {}
    return args if isinstance(args, dict) else {}


class _Pass:
    """What one pass over a trace's complete events keeps, per thread where order in time matters."""

    def __init__(self) -> None:
        self.ops: dict[tuple[Any, Any], list[_Op]] = collections.defaultdict(list)
        self.marks: dict[tuple[Any, Any], list[tuple[float, str]]] = collections.defaultdict(list)
        self.launches: dict[tuple[Any, Any], list[tuple[float, int]]] = collections.defaultdict(list)
        self.device: dict[int, tuple[float, int]] = {}  # correlation -> (device time, activities)
        self.device_ids: collections.Counter[Any] = collections.Counter()
        self.host: set[int] = set()  # correlations of copies between the host and the device
        self.frames = Frames()
        self.steps = self.shaped = self.python = 0
        self.shaped_names: collections.Counter[str] = collections.Counter()
        self.unmodelled_spans: dict[Any, list[tuple[float, float, str]]] = collections.defaultdict(list)
        self.step_us: list[tuple[str, float]] = []  # (ProfilerStep#N, its duration)
        self.device_us = 0.0  # every kernel, copy and fill of the device

    def take(self, e: _Event) -> None:
        cat = e.cat
        if cat in STEP_CATEGORIES and isinstance(e.name, str) and e.name.startswith(STEP_PREFIX):
            self.steps += 1
            self.step_us.append((e.name, _num(e.dur)))
        if cat in OP_CATEGORIES:
            self._op(e, _args(e))
        elif cat == "python_function":
            if isinstance(e.name, str):
                self.python += 1
                self.frames.python_frame((e.pid, e.tid), _num(e.ts), _num(e.dur), e.name)
        elif cat in LAUNCH_CATEGORIES:
            corr = _args(e).get("correlation")
            if isinstance(corr, int):
                self.launches[(e.pid, e.tid)].append((_num(e.ts), corr))
        elif cat in DEVICE_CATEGORIES:
            self._device_work(e, cat, _args(e))

    def _op(self, e: _Event, args: dict[str, Any]) -> None:
        name = e.name
        if not isinstance(name, str):
            return
        dims = args.get("Input Dims")
        if dims is not None:
            self.shaped += 1
            self.shaped_names[name] += 1
        key = (e.pid, e.tid)
        ts, dur = _num(e.ts), _num(e.dur)
        seq = args.get("Sequence number")
        if isinstance(seq, int):
            self.frames.sequenced_op(key, ts, dur, seq, name)
        if name.endswith(_CONV_PARTS):
            self.marks[key].append((ts, name))
        if family_of(name) is None:
            if dims is not None and name.startswith("aten::") and name not in NO_WORK:
                self.unmodelled_spans[key].append((ts, ts + dur, name))
            return
        if not isinstance(dims, list):
            return
        types, concrete, strides = (
            args.get("Input type"),
            args.get("Concrete Inputs"),
            args.get("Input Strides"),
        )
        strides = strides if isinstance(strides, list) else []
        op = _Op(name, ts, dur, OpInputs(dims, _texts(types), _texts(concrete), strides))
        stack = args.get("Call stack")
        op.call_stack = stack if isinstance(stack, str) else None
        self.ops[key].append(op)

    def unlaunched_us(self) -> float:
        """Device work without a launch in the trace: queued before the trace began, or with no correlation."""
        launched = {corr for thread in self.launches.values() for _, corr in thread}
        correlated = sum(dur for dur, _ in self.device.values())
        return self.device_us - correlated + sum(d for c, (d, _) in self.device.items() if c not in launched)

    def _device_work(self, e: _Event, cat: Any, args: dict[str, Any]) -> None:
        self.device_us += _num(e.dur)
        corr = args.get("correlation")
        if not isinstance(corr, int):
            return
        dur, n = self.device.get(corr, (0.0, 0))
        self.device[corr] = (dur + _num(e.dur), n + 1)
        self.device_ids[args.get("device")] += 1
        if cat in ("gpu_memcpy", "Memcpy") and any(h in str(e.name) for h in _HOST):
            self.host.add(corr)


def _texts(values: Any) -> list[str]:
    """A recorded list of texts (`Input type`, `Concrete Inputs`), anything else in it as ""."""
    return [v if isinstance(v, str) else "" for v in values] if isinstance(values, list) else []


def _num(value: Any) -> float:
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def _nest(
    ops: dict[tuple[Any, Any], list[_Op]],
    marks: dict[tuple[Any, Any], list[tuple[float, str]]],
    launches: dict[tuple[Any, Any], list[tuple[float, int]]],
    device: dict[int, tuple[float, int]],
    host: set[int],
) -> None:
    """Per thread, in time order: each op's cost (a 2021 convolution's output from its backward), which ops
    hold a costed op inside them, and whose launches are whose."""
    conv_out = _conv_outputs(ops)
    for key, thread in ops.items():
        thread.sort(key=lambda o: (o.ts, -o.dur))
        # (ts, kind, item): ops first at a tie, so that a launch at an op's first microsecond is inside it
        timeline: list[tuple[float, int, Any]] = [(o.ts, 0, o) for o in thread]
        timeline += [(ts, 1, name) for ts, name in marks.get(key, ())]
        timeline += [(ts, 2, corr) for ts, corr in launches.get(key, ()) if corr in device]
        timeline.sort(key=lambda t: (t[0], t[1]))
        stack: list[_Op] = []
        for ts, kind, item in timeline:
            while stack and stack[-1].end <= ts:
                stack.pop()
            if kind == 0:
                stack.append(item)
            elif kind == 1:
                for op in reversed(stack):
                    if op.name.endswith("convolution_backward"):
                        op.children = (op.children or set()) | {item}
                        break
            elif stack:
                dur, n = device[item]
                stack[-1].device_us += dur
                stack[-1].kernels += n
                stack[-1].host = stack[-1].host or item in host
        # costs, then cover: an op with a costed op inside it is not counted itself
        for op in thread:
            shape = conv_forward_shapes(op.name, op.inputs)
            op.cost = cost_of(op.name, _with_parts(op), conv_output=conv_out.get(shape) if shape else None)
        _cover(thread)


def _with_parts(op: _Op) -> OpInputs:
    """A 2021 convolution backward's inputs with the output mask its parts tell (it records none)."""
    if op.children is None or any("True" in c or "False" in c for c in op.inputs.concrete):
        return op.inputs
    at = CONV_BACKWARDS[op.name][3] if op.name in CONV_BACKWARDS else None  # (its output mask's position)
    if at is None:
        return op.inputs
    mask = f"[{any(c.endswith('_input') for c in op.children)}, {any(c.endswith('_weight') for c in op.children)}]"
    concrete = [*op.inputs.concrete, *[""] * (at + 1 - len(op.inputs.concrete))]
    concrete[at] = mask
    return OpInputs(op.inputs.dims, op.inputs.types, concrete, op.inputs.strides)


def _cover(thread: list[_Op]) -> None:
    """An op of a family with a costed op of the same family inside it is counted as that one (`aten::linear`
    as its `aten::mm`; the compute families are one here: see _kind; a foreach or fused optimizer op as the
    per-tensor ops a CPU runs inside it); an op of another family inside a costed
    one (an `aten::copy_` of the bias inside a CPU `aten::addmm`) is counted too, and its wall time is taken off
    the outer op's."""
    stack: list[_Op] = []
    for op in thread:
        while stack and stack[-1].end <= op.ts:
            stack.pop()
        if op.cost is not None:
            for outer in reversed(stack):
                if outer.cost is None:
                    if _work_of(family_of(outer.name), op.cost.family):
                        outer.holds_counted = True  # (its work is this op's: not said to be missing)
                    continue
                if _kind(outer.cost.family) == _kind(op.cost.family) or outer.cost.family == "optimizer":
                    # (a foreach op on a CPU runs per-tensor ops inside it: they are its work, counted once)
                    outer.covered = True
                    # Its own outers were dealt with when it was (it holds this op's time already): a second
                    # walk would cover them again, or take this op's time off another family's op twice
                    break
                outer.inner_us += op.dur
                break
        stack.append(op)


def _kind(family: str) -> str:
    """Families that cover one another: the compute families are one (attention's math path is counted as the
    products it runs), each other family is its own."""
    return "compute" if family in COMPUTE_FAMILIES else family


def _work_of(outer: str | None, inner: str) -> bool:
    """Whether an op of family `outer` that has no cost does its work through a counted op of family `inner`
    inside it: one of its kind (a linear's product, a CPU foreach op's per-tensor ops), or, for a memory-bound
    op, another memory-bound op that is not a mere copy or fill (an adaptive pool's mean); a product's bias
    copy alone is not its work."""
    if outer is None:
        return False
    if _kind(outer) == _kind(inner) or outer == "optimizer":
        return True
    return (
        outer not in COMPUTE_FAMILIES and inner not in COMPUTE_FAMILIES and inner not in ("copy", "transfer")
    )


def _conv_outputs(ops: dict[tuple[Any, Any], list[_Op]]) -> dict[tuple[Any, Any], list[int]]:
    out: dict[tuple[Any, Any], list[int]] = {}
    for thread in ops.values():
        for op in thread:
            found = conv_backward_shapes(op.name, op.inputs)
            if found is not None:
                out[(found[0], found[1])] = found[2]
    return out


def _count(
    ops: dict[tuple[Any, Any], list[_Op]], on_device: bool
) -> tuple[list[OpCall], dict[str, int], dict[str, str]]:
    calls: list[OpCall] = []
    uncounted: collections.Counter[str] = collections.Counter()
    missing: dict[str, str] = {}
    for thread in ops.values():
        for op in thread:
            if op.covered:
                continue
            if op.cost is None and op.holds_counted:
                continue  # (a CPU's foreach op runs its per-tensor ops inside it, and they are counted)
            if op.cost is None:
                uncounted[op.name] += 1
                missing.setdefault(op.name, lacks(op))
                continue
            if on_device and op.kernels == 0:
                continue  # no device work of its own (a view, or work another op launched)
            time_us = op.device_us if on_device else max(op.dur - op.inner_us, 0.0)
            cost = op.cost
            if op.host:  # a copy over the host's link, not the device memory's
                cost = msgspec.structs.replace(cost, family="transfer", flops=None, dtype=None)
            calls.append(
                OpCall(op.name, op.inputs, cost, time_us, op.kernels, op.stack, op.module, op.backward)
            )
    return calls, dict(uncounted), missing


def _rank(head: dict[str, Any]) -> int | None:
    raw = head.get("distributedInfo")
    try:
        info = msgspec.json.decode(bytes(raw)) if raw is not None else None
    except msgspec.DecodeError:
        return None
    rank = info.get("rank") if isinstance(info, dict) else None
    return rank if isinstance(rank, int) and rank >= 0 else None


def _device(head: dict[str, Any], device_ids: collections.Counter[Any]) -> tuple[str | None, int | None]:
    """The name and memory of the device most of the kernels ran on (deviceProperties)."""
    raw = head.get("deviceProperties")
    try:
        props = msgspec.json.decode(bytes(raw)) if raw is not None else None
    except msgspec.DecodeError:
        return None, None
    if not isinstance(props, list) or not props:
        return None, None
    wanted = device_ids.most_common(1)[0][0] if device_ids else None
    chosen = next((p for p in props if isinstance(p, dict) and p.get("id") == wanted), props[0])
    if not isinstance(chosen, dict):
        return None, None
    name = chosen.get("name")
    memory = chosen.get("totalGlobalMem")
    if isinstance(name, str):
        name = name_by_properties(name, chosen)
    return (name if isinstance(name, str) else None), (memory if isinstance(memory, int) else None)
