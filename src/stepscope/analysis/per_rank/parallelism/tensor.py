"""Tensor parallel communication of one rank: the functional collectives (`_c10d_functional::all_reduce`,
`all_gather_into_tensor`, `reduce_scatter_tensor`, ...: DTensor and torch.compile's) by the layer they run in,
and the fused async-TP ops (`symm_mem::fused_all_gather_matmul`, `fused_matmul_reduce_scatter`, ...) with their
communication and the part of it that runs under their own matmuls. The rules are documented in
docs/analysis.md ("Tensor parallel").

A collective's layer is the innermost `nn.Module: <Class>_<n>` range around it (torch.profiler's with_modules,
with with_stack); without module ranges, its position: the phase it runs in (forward, backward, ...; before the
step's backward counts as forward) and its order among the functional collectives of that phase in its step
(`forward #2`).
"""

from __future__ import annotations

import msgspec
import numpy as np

from stepscope.analysis import intervals as iv
from stepscope.analysis.per_rank.comm.issued_ops import IssuedOp, issued_ops
from stepscope.analysis.per_rank.comm_names import FUNCTIONAL_PREFIXES, async_tp_op
from stepscope.analysis.per_rank.kernels import COMMUNICATION, COMPUTATION
from stepscope.analysis.per_rank.prepare import RankData
from stepscope.analysis.per_rank.steps import assign_phases
from stepscope.analysis.read.table import MISSING

MODULE_PREFIX = "nn.Module: "
_X = ord("X")


class LayerCollectives(msgspec.Struct):
    """The functional collectives of one kind in one layer (or position) of one rank, over the window."""

    layer: str  # `Linear_1` (a module range), else the position: `forward #1`
    layer_source: str  # module | position
    kind: str
    op: str  # the functional collective's name
    count: int
    per_step: float
    bytes: int | None  # input messages summed; null when a size is missing
    time_ms: float | None  # union of what ran them (kernels or the CPU backend's ranges); null: only counted
    time_source: str | None  # device | cpu | null
    exposed_ms: float | None  # device time with no computation kernel running; null on CPU backends


class FusedOps(msgspec.Struct):
    """The fused async-TP ops of one name on one rank: matmul and collective at once. Their GPU activity splits
    into computation (the matmuls) and communication (the peer copies and symmetric-memory kernels, counted as
    communication: kernels.py); `overlapped_ms` of the communication runs under computation."""

    op: str  # fused_all_gather_matmul | fused_matmul_reduce_scatter | ...
    count: int
    time_ms: float  # union of their GPU activity
    compute_ms: float
    comm_ms: float
    overlapped_ms: float
    exposed_ms: float  # comm_ms - overlapped_ms


class TensorRank(msgspec.Struct):
    """`analyze --json`'s `tensor.ranks[]`: one rank's tensor-parallel communication."""

    rank: int
    steps: int
    layers: list[LayerCollectives]
    fused: list[FusedOps]


class Tensor(msgspec.Struct):
    """`analyze --json`'s `tensor`."""

    ranks: list[TensorRank]


def _ms(ns: int) -> float:
    return round(ns / 1e6, 6)


def tensor_rank(data: RankData) -> TensorRank | None:
    """The rank's functional collectives by layer and its fused async-TP ops; None when it has neither."""
    ops = issued_ops(data, prefixes=FUNCTIONAL_PREFIXES)
    fused = fused_ops(data)
    if not ops and not fused:
        return None
    layers = _layers(data, ops)
    groups: dict[tuple[str, str, str, str], list[IssuedOp]] = {}
    for op, (layer, source) in zip(ops, layers, strict=True):
        groups.setdefault((layer, source, op.kind, op.name), []).append(op)
    steps = max(len(data.steps), 1)
    rows = []
    for (layer, source, kind, name), members in groups.items():
        sources = {m.time_source for m in members}
        time_source = sources.pop() if len(sources) == 1 else None
        time = _union([m.time for m in members])
        exposed = [m.exposed for m in members if m.exposed is not None]
        sizes = [m.in_bytes for m in members]
        rows.append(
            LayerCollectives(
                layer, source, kind, name, len(members), round(len(members) / steps, 3),
                None if any(s is None for s in sizes) else sum(s for s in sizes if s is not None),
                _ms(iv.length(time)) if time_source else None, time_source,
                _ms(iv.length(_union(exposed))) if time_source == "device" else None,
            )
        )  # fmt: skip
    first = {key: min(m.start for m in members) for key, members in groups.items()}
    rows.sort(key=lambda r: first[(r.layer, r.layer_source, r.kind, r.op)])
    return TensorRank(data.rank, len(data.steps), rows, fused)


def _union(parts: list[iv.Intervals]) -> iv.Intervals:
    if not parts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return iv.merge(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))


def _layers(data: RankData, ops: list[IssuedOp]) -> list[tuple[str, str]]:
    """(layer, layer_source) of each op: its innermost module range, else its position."""
    table = data.table
    cols = table.columns
    is_module = table.name_values(lambda n: n.startswith(MODULE_PREFIX), bool, key="nn_module")
    modules = np.flatnonzero(is_module[cols["name"]] & (cols["ph"] == _X))
    phases = assign_phases(table) if ops else {}
    backward = phases.get("backward")
    step_start = np.asarray(data.steps.start, dtype=np.int64)
    ordinal: dict[tuple[int, str], int] = {}
    out = []
    for op in ops:
        row = op.row
        ts = int(cols["ts"][row])
        around = modules[
            (cols["pid"][modules] == cols["pid"][row])
            & (cols["tid"][modules] == cols["tid"][row])
            & (cols["ts"][modules] <= ts)
            & (cols["ts"][modules] + cols["dur"][modules] >= ts + cols["dur"][row])
        ]
        if len(around):
            inner = around[np.argmax(cols["ts"][around])]
            out.append((table.names[int(cols["name"][inner])][len(MODULE_PREFIX) :], "module"))
            continue
        step = int(np.searchsorted(step_start, ts, side="right")) - 1
        phase = next((p for p, spans in phases.items() if _inside(spans, ts)), None)
        if phase is None:
            phase = "forward" if _before_backward(backward, ts, data, step) else "other"
        ordinal[(step, phase)] = ordinal.get((step, phase), 0) + 1
        out.append((f"{phase} #{ordinal[(step, phase)]}", "position"))
    return out


def _inside(spans: iv.Intervals, at: int) -> bool:
    i = int(np.searchsorted(spans[0], at, side="right")) - 1
    return i >= 0 and spans[1][i] > at


def _before_backward(backward: iv.Intervals | None, at: int, data: RankData, step: int) -> bool:
    """`at` comes before the backward of its step (the step runs a backward after it)."""
    if backward is None or not len(backward[0]):
        return False
    starts = np.asarray(data.steps.start, dtype=np.int64)
    end = int(starts[step + 1]) if 0 <= step < len(starts) - 1 else data.hi
    later = backward[0][(backward[0] > at) & (backward[0] < end)]
    earlier = backward[0][
        (backward[0] <= at) & (backward[0] >= (int(starts[step]) if step >= 0 else data.lo))
    ]
    return len(later) > 0 and len(earlier) == 0


def fused_ops(data: RankData) -> list[FusedOps]:
    """Per fused async-TP op name: its GPU activity (launched inside its range, kernels.gpu_events' `fused`),
    split into computation and communication."""
    gpu = data.gpu
    if not len(gpu) or not (gpu.fused != MISSING).any():
        return []
    table = data.table
    by_op: dict[str, list[int]] = {}
    for i in np.flatnonzero(gpu.fused != MISSING).tolist():
        name = async_tp_op(table.names[int(table.columns["name"][int(gpu.fused[i])])]) or ""
        by_op.setdefault(name, []).append(i)
    out = []
    for name, idx_list in by_op.items():
        idx = np.array(idx_list, dtype=np.int64)
        comp = idx[gpu.kind[idx] == COMPUTATION]
        comm = idx[gpu.kind[idx] == COMMUNICATION]
        comp_u = iv.merge(gpu.start[comp], gpu.end[comp])
        comm_u = iv.merge(gpu.start[comm], gpu.end[comm])
        exposed = iv.subtract(comm_u, comp_u)
        comm_ns = iv.length(comm_u)
        out.append(
            FusedOps(
                name, len(np.unique(gpu.fused[idx])), _ms(iv.length(iv.merge(gpu.start[idx], gpu.end[idx]))),
                _ms(iv.length(comp_u)), _ms(comm_ns), _ms(comm_ns - iv.length(exposed)), _ms(iv.length(exposed)),
            )
        )  # fmt: skip
    return out
