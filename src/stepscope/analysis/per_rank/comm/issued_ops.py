"""The collective ops a rank issued inside its window, each with its message (sizes, splits) and the time of what
ran it: the communication kernels launched inside it (device time) or the CPU backend's range paired with it
(gloo, mpi, ucc: CPU time). Shared by the expert (all-to-all) and tensor-parallel (functional collective) views.
"""

from __future__ import annotations

import msgspec
import numpy as np

from stepscope.analysis import intervals as iv
from stepscope.analysis.per_rank.comm.collectives import _backend, _text, cpu_rows
from stepscope.analysis.per_rank.comm.issued import IssuedOps
from stepscope.analysis.per_rank.comm_names import CPU_BACKENDS, element_bytes
from stepscope.analysis.per_rank.kernels import COMMUNICATION, COMPUTATION
from stepscope.analysis.per_rank.prepare import RankData
from stepscope.analysis.read.messages import split_sizes
from stepscope.analysis.read.table import MISSING


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


def issued_ops(
    data: RankData, kinds: frozenset[str] | None = None, prefixes: tuple[str, ...] | None = None
) -> list[IssuedOp]:
    """The outermost collective ops (c10d ops, functional collectives) issued inside the rank's window, of
    `kinds` (all kinds when None) and whose names start with one of `prefixes` (any name when None), by issue
    time; a record_param_comms issued outside any op stands for one. Linear in the trace's collectives: the ops
    left out cost no more than finding them."""
    table = data.table
    cols = table.columns
    everywhere = cpu_rows(table)
    issued = IssuedOps(table, everywhere)
    recorded = [(row, kind) for row, found, kind in everywhere if found == "record_param_comms"]
    params: dict[int, list[int]] = {}
    lone: list[tuple[int, str]] = []
    ops = issued.enclosing_rows(np.array([row for row, _ in recorded], dtype=np.int64)).tolist()
    for (row, kind), op in zip(recorded, ops, strict=True):
        if op != MISSING:
            params.setdefault(op, []).append(row)
        else:
            lone.append((row, kind))
    candidates = []
    for row, kind in [(row, issued.kind[row]) for row in issued.rows] + lone:
        start = int(cols["ts"][row])
        if not data.lo <= start < data.hi or (kinds is not None and kind not in kinds):
            continue
        if prefixes is not None and not table.names[int(cols["name"][row])].startswith(prefixes):
            continue
        candidates.append((start, row, kind))
    if not candidates:
        return []
    candidates.sort()
    ranges = [r for r in everywhere if r[1] == "backend_range" and _backend(table, r[0]) in CPU_BACKENDS]
    paired = {op: rng for rng, op in issued.pair_ranges(ranges).items()}
    comm = data.gpu_all.of_kind(COMMUNICATION)
    comm = comm.select(comm.context != MISSING) if len(comm) else comm
    by_op: dict[int, list[int]] = {}  # issued op row -> its communication kernels
    for i, op in enumerate(issued.enclosing_rows(comm.context).tolist()):
        by_op.setdefault(op, []).append(i)
    compute = data.gpu_all.of_kind(COMPUTATION)
    busy = iv.merge(compute.start, compute.end)
    times: list[iv.Intervals] = []
    sources: list[str | None] = []
    for _, row, _ in candidates:
        mine = by_op.get(row)
        if mine:
            if len(mine) == 1:
                i = mine[0]
                times.append((comm.start[i : i + 1], comm.end[i : i + 1]))
            else:
                times.append(iv.merge(comm.start[mine], comm.end[mine]))
            sources.append("device")
        elif row in paired:
            s = int(cols["ts"][paired[row]])
            times.append((np.array([s], np.int64), np.array([s + int(cols["dur"][paired[row]])], np.int64)))
            sources.append("cpu")
        else:
            times.append((np.zeros(0, np.int64), np.zeros(0, np.int64)))  # only counted
            sources.append(None)
    exposed = _exposed(times, sources, busy)
    out = []
    for (start, row, kind), time, source, bare in zip(candidates, times, sources, exposed, strict=True):
        in_b, out_b, in_split, out_split = _message(
            data, [*params.get(row, []), row, paired.get(row, MISSING)]
        )
        out.append(
            IssuedOp(
                row, table.names[int(cols["name"][row])], kind, start, in_b, out_b, in_split, out_split,
                time, source, bare,
            )
        )  # fmt: skip
    return out


def _exposed(
    times: list[iv.Intervals], sources: list[str | None], busy: iv.Intervals
) -> list[iv.Intervals | None]:
    """Each op's device time with no computation kernel running (`busy`); None for the others."""
    device = [i for i, source in enumerate(sources) if source == "device"]
    out: list[iv.Intervals | None] = [None] * len(times)
    if not device:
        return out
    lengths = np.array([len(times[i][0]) for i in device], dtype=np.int64)
    starts = np.concatenate([times[i][0] for i in device])
    ends = np.concatenate([times[i][1] for i in device])
    part_s, part_e, owner = iv.subtract_each(starts, ends, busy)
    op = np.repeat(np.arange(len(device), dtype=np.int64), lengths)[owner]  # the op of each part, ascending
    cuts = np.searchsorted(op, np.arange(len(device) + 1, dtype=np.int64))
    for k, i in enumerate(device):
        out[i] = (part_s[cuts[k] : cuts[k + 1]], part_e[cuts[k] : cuts[k + 1]])
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
