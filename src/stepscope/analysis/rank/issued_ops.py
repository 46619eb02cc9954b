"""The collective ops a rank issued inside its window, each with its message (sizes, splits) and the time of what
ran it: the communication kernels launched inside it (device time) or the CPU backend's range paired with it
(gloo, mpi, ucc: CPU time). Shared by the expert (all-to-all) and tensor-parallel (functional collective) views.
"""

from __future__ import annotations

import msgspec
import numpy as np

from stepscope.analysis import intervals as iv
from stepscope.analysis.rank.collectives import _backend, _cpu_rows, _text
from stepscope.analysis.rank.comm_names import CPU_BACKENDS, element_bytes
from stepscope.analysis.rank.issued import IssuedOps
from stepscope.analysis.rank.kernels import COMMUNICATION, COMPUTATION
from stepscope.analysis.rank.prepare import RankData
from stepscope.analysis.read.table import MISSING, split_sizes

_LOW, _HIGH = np.iinfo(np.int64).min, np.iinfo(np.int64).max


class IssuedOp(msgspec.Struct):
    """One collective op the rank issued: its row, name and kind, its message and what ran it."""

    row: int
    name: str
    kind: str
    start: int  # ns, when it was issued
    in_bytes: int | None
    out_bytes: int | None
    in_split: list[int] | None  # rows sent to each rank of the group (None: not recorded or even splits)
    out_split: list[int] | None
    time: iv.Intervals  # what ran it: its kernels (device) or its backend range (cpu); empty when unknown
    time_source: str | None  # "device", "cpu", None
    exposed: iv.Intervals | None  # device time with no computation kernel running; None for CPU time


def issued_ops(data: RankData, kinds: frozenset[str] | None = None) -> list[IssuedOp]:
    """The outermost collective ops (c10d ops, functional collectives) issued inside the rank's window, of
    `kinds` (all kinds when None), by issue time; a record_param_comms issued outside any op stands for one."""
    table = data.table
    cols = table.columns
    everywhere = _cpu_rows(table, _LOW, _HIGH)
    issued = IssuedOps(table, everywhere)
    params: dict[int, list[int]] = {}
    lone: list[tuple[int, str]] = []
    for row, found, kind in everywhere:
        if found == "record_param_comms":
            op = issued.enclosing(row)
            if op != MISSING:
                params.setdefault(op, []).append(row)
            else:
                lone.append((row, kind))
    ranges = [r for r in everywhere if r[1] == "backend_range" and _backend(table, r[0]) in CPU_BACKENDS]
    paired = {op: rng for rng, op in issued.pair_ranges(ranges).items()}
    comm = data.gpu_all.of_kind(COMMUNICATION)
    comm = comm.select(comm.context != MISSING) if len(comm) else comm
    kernel_op = np.array([issued.enclosing(int(c)) for c in comm.context.tolist()], dtype=np.int64)
    compute = data.gpu_all.of_kind(COMPUTATION)
    busy = iv.merge(compute.start, compute.end)
    candidates = [(row, issued.kind[row]) for row in issued.rows] + lone
    out = []
    for row, kind in sorted(candidates, key=lambda c: int(cols["ts"][c[0]])):
        start = int(cols["ts"][row])
        if not data.lo <= start < data.hi or (kinds is not None and kind not in kinds):
            continue
        mine = np.flatnonzero(kernel_op == row)
        exposed: iv.Intervals | None = None
        source: str | None
        if len(mine):
            time = iv.merge(comm.start[mine], comm.end[mine])
            source = "device"
            exposed = iv.subtract(time, busy)
        elif row in paired:
            rng = paired[row]
            s = int(cols["ts"][rng])
            time = (np.array([s], np.int64), np.array([s + int(cols["dur"][rng])], np.int64))
            source = "cpu"
        else:
            time, source = (np.zeros(0, np.int64), np.zeros(0, np.int64)), None  # only counted
        in_b, out_b, in_split, out_split = _message(
            data, [*params.get(row, []), row, paired.get(row, MISSING)]
        )
        out.append(
            IssuedOp(
                row, table.names[int(cols["name"][row])], kind, start, in_b, out_b, in_split, out_split,
                time, source, exposed,
            )
        )  # fmt: skip
    return out


def _message(
    data: RankData, rows: list[int]
) -> tuple[int | None, int | None, list[int] | None, list[int] | None]:
    """(in bytes, out bytes, in splits, out splits) from the first of `rows` with a size (record_param_comms
    first, then the op's own recorded inputs, then its CPU backend range's)."""
    table = data.table
    cols = table.columns
    for row in rows:
        if row == MISSING:
            continue
        nelems = int(cols["args_in_nelems"][row])
        width = element_bytes(_text(table, "args_dtype", row))
        if nelems < 0 or not width:
            continue
        out_n = int(cols["args_out_nelems"][row])
        return (
            nelems * width,
            out_n * width if out_n >= 0 else None,
            split_sizes(_text(table, "args_in_split", row)) or None,
            split_sizes(_text(table, "args_out_split", row)) or None,
        )
    return None, None, None, None
