"""FSDP on one rank: its units (the modules it shards), each unit's all-gathers and reduce-scatters per step,
and the all-gather time the step shows (exposed: see exposed.py), in forward and in backward.

FSDP annotates its work with `record_function` ranges on the thread that runs it, and each collective is issued
(a c10d op, see issued.py) inside them:

- FSDP2 (`fully_shard`): `FSDP::all_gather (fqn)`, `FSDP::pre_forward (fqn)`, `FSDP::forward_prefetch for
  fqn`, `FSDP::pre_backward (fqn)`, `FSDP::backward_prefetch for fqn`, `FSDP::post_backward_reduce (fqn)`, ...,
  `fqn` the unit's module FQN (absent for the root module's own parameters: the unit `<root>`; a
  ` [pg=N]` suffix when a module has several parameter groups). A collective belongs to the unit its innermost
  FSDP range names, to forward when a `pre_forward` / `forward_prefetch` range holds it, else to backward.
- FSDP1 (`FullyShardedDataParallel`): `FullyShardedDataParallel._pre_forward`, `._pre_forward_prefetch`,
  `._pre_backward_hook`, `._pre_backward_prefetch`, `._post_backward_hook`, `._post_backward_prefetch`, which
  name no module. Units are numbered in the order of their `_pre_forward` in each step (`unit 0`, ...): an
  all-gather in a `_pre_forward` is that unit's, one in its `_pre_forward_prefetch` the next unit's. In backward
  a unit is known by its flat parameter's size: an all-gather whose message is the size of exactly one forward
  unit's is that unit's, a reduce-scatter whose input is the size of exactly one unit's gathered output too;
  others stay without a unit (`unattributed`).

Times are the collectives' own (the gloo range, the kernels), unions in time; `exposed` is the part of the
all-gathers' union that exposed_communication leaves.
"""

from __future__ import annotations

import re

import msgspec
import numpy as np

from stepscope.analysis import intervals as iv
from stepscope.analysis.per_rank.comm.collectives import Instances, cpu_rows
from stepscope.analysis.per_rank.comm.exposed import exposed_communication
from stepscope.analysis.per_rank.comm.issued import IssuedOps
from stepscope.analysis.per_rank.prepare import RankData
from stepscope.analysis.read.table import MISSING, TraceTable

__all__ = ["FsdpAnalysis", "FsdpRank", "FsdpStep", "FsdpUnit", "combine_fsdp", "fsdp_rank"]

ROOT_UNIT = "<root>"
KINDS = ("all_gather", "reduce_scatter")
FSDP2_RANGE = re.compile(
    r"^FSDP::(?P<what>[a-z_]+?)(?: for (?P<target>\S*))?(?: \((?P<fqn>[^()]*)\))?(?: \[pg=\d+\])?$"
)
FSDP1_PREFIX = "FullyShardedDataParallel."
_FORWARD = ("pre_forward", "forward_prefetch", "root_pre_forward", "_pre_forward", "_pre_forward_prefetch")


class FsdpUnit(msgspec.Struct):
    """One FSDP unit on one rank, per step of the window (the window's totals over its steps)."""

    unit: str  # FSDP2: the module FQN ("<root>": the root's own parameters); FSDP1: "unit N", forward order
    index: int  # position in forward order
    all_gathers_per_step: float
    all_gather_bytes_per_step: float | None  # null when a message size is unknown
    all_gather_ms_per_step: float | None  # null when the collectives are not timed
    exposed_all_gather_ms_per_step: float | None
    reduce_scatters_per_step: float
    reduce_scatter_bytes_per_step: float | None
    reduce_scatter_ms_per_step: float | None


class FsdpStep(msgspec.Struct):
    """The all-gathers and reduce-scatters of one step of one rank (by the step their op was issued in; times:
    the part of the union inside the step)."""

    step: int
    all_gathers: int
    all_gather_bytes: int | None
    all_gather_ms: float | None
    exposed_all_gather_ms: float | None  # of all_gather_ms, what the rank's other work does not hide
    exposed_forward_ms: float | None  # of it, of the all-gathers issued in forward
    exposed_backward_ms: float | None  # ... in backward
    reduce_scatters: int
    reduce_scatter_bytes: int | None
    reduce_scatter_ms: float | None


class FsdpRank(msgspec.Struct):
    """FSDP on one rank."""

    rank: int
    version: int  # 1 (FullyShardedDataParallel) or 2 (fully_shard)
    time_source: str | None  # the collectives' time: "device", "cpu" (gloo), "cpu enqueue", null (untimed)
    units: list[FsdpUnit]  # forward order
    steps: list[FsdpStep]
    unattributed: int  # all-gathers and reduce-scatters that no unit's range holds
    notes: list[str] = []


class FsdpAnalysis(msgspec.Struct):
    """`analyze --json`'s `fsdp`: the FSDP version and each FSDP rank's units and steps."""

    version: int
    ranks: list[FsdpRank]


def _version(table: TraceTable) -> int | None:
    names = table.columns["name"]
    two = table.names_matching(lambda n: n.startswith("FSDP::"), key="fsdp2_range", among=names)
    if two[names].any():
        return 2
    one = table.names_matching(lambda n: n.startswith(FSDP1_PREFIX), key="fsdp1_range", among=names)
    return 1 if one[names].any() else None


class _Ranges:
    """The FSDP ranges of a table, per thread, by start, each with its innermost enclosing FSDP range (they nest
    on a thread: one pass with a stack)."""

    def __init__(self, table: TraceTable, version: int) -> None:
        cols = table.columns
        names = cols["name"]
        prefix = "FSDP::" if version == 2 else FSDP1_PREFIX
        mask = table.names_matching(lambda n: n.startswith(prefix), key=("fsdp_range", prefix), among=names)
        rows = np.flatnonzero(mask[names] & (cols["ph"] == ord("X")))
        rows = rows[np.lexsort((-cols["dur"][rows], cols["ts"][rows]))]
        self.table = table
        self.by_thread: dict[tuple[int, int], list[int]] = {}
        for row in rows.tolist():
            self.by_thread.setdefault((int(cols["pid"][row]), int(cols["tid"][row])), []).append(row)
        self._threads: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, list[int]]] = {}
        for key, found in self.by_thread.items():
            start = cols["ts"][np.array(found, dtype=np.int64)].astype(np.int64)
            end = start + cols["dur"][np.array(found, dtype=np.int64)]
            parent: list[int] = []
            stack: list[int] = []
            for i in range(len(found)):
                while stack and end[stack[-1]] <= start[i]:
                    stack.pop()
                parent.append(stack[-1] if stack else -1)
                stack.append(i)
            self._threads[key] = (start, end, parent)

    def around(self, row: int) -> list[int]:
        """The FSDP ranges on `row`'s thread that hold its start, innermost first."""
        cols = self.table.columns
        key = (int(cols["pid"][row]), int(cols["tid"][row]))
        if key not in self._threads:
            return []
        start, end, parent = self._threads[key]
        rows = self.by_thread[key]
        ts = int(cols["ts"][row])
        at = int(np.searchsorted(start, ts, side="right")) - 1
        while at >= 0 and end[at] <= ts:  # the latest range started before `row` ended: its ancestors may not
            at = parent[at]
        held = []
        while at >= 0:
            held.append(rows[at])
            at = parent[at]
        return held

    def name(self, row: int) -> str:
        return self.table.name_of(row)


def _issuing_ops(data: RankData, inst: Instances) -> list[int]:
    """Per instance, the row of the c10d op that issued it (MISSING when none is found)."""
    table = data.table
    everywhere = cpu_rows(table)
    issued = IssuedOps(table, everywhere)
    ts, dur = table.columns["ts"], table.columns["dur"]
    if inst.source == "backend_range":
        paired = issued.pair_ranges(
            [(int(r), "backend_range", k) for r, k in zip(inst.row, inst.kind, strict=True)]
        )
        return [paired.get(int(r), MISSING) for r in inst.row]
    if inst.source in ("c10d_op", "record_param_comms"):
        return [issued.enclosing(int(r)) for r in inst.row]
    starts = np.array([int(ts[r]) for r in issued.rows], dtype=np.int64)
    out = []
    for at in inst.issue.tolist():  # kernels: the issued op whose span holds the launch
        i = int(np.searchsorted(starts, at, side="right")) - 1
        while i >= 0 and int(ts[issued.rows[i]] + dur[issued.rows[i]]) <= at:
            i -= 1
        out.append(issued.rows[i] if i >= 0 else MISSING)
    return out


def _fsdp2_place(ranges: _Ranges, op: int) -> tuple[str | None, str]:
    """(unit, phase) of a collective issued by `op`, from the FSDP2 ranges around it."""
    unit: str | None = None
    phase = "backward"
    for row in ranges.around(op):
        match = FSDP2_RANGE.match(ranges.name(row))
        if match is None:
            continue
        if unit is None and match["what"] in ("all_gather", "post_backward_reduce", "unshard"):
            unit = match["fqn"] if match["fqn"] else ROOT_UNIT
        if match["what"] in _FORWARD:
            phase = "forward"
    return unit, phase


def _fsdp1_places(
    data: RankData, ranges: _Ranges, ops: list[int], inst: Instances
) -> tuple[list[str | None], list[str], list[str]]:
    """(unit, phase) per instance for FSDP1 (the module doc's rules), and notes."""
    table = data.table
    cols = table.columns
    suffix = len(FSDP1_PREFIX)
    pre_forward = sorted(
        (r for rows in ranges.by_thread.values() for r in rows if ranges.name(r)[suffix:] == "_pre_forward"),
        key=lambda r: int(cols["ts"][r]),
    )
    starts = np.array([int(cols["ts"][r]) for r in pre_forward], dtype=np.int64)
    step_of = np.searchsorted(data.steps.start, starts, side="right") - 1
    order = np.zeros(len(pre_forward), dtype=np.int64)  # each _pre_forward's position in its step
    for i in range(1, len(pre_forward)):
        order[i] = order[i - 1] + 1 if step_of[i] == step_of[i - 1] else 0
    units: list[str | None] = [None] * len(ops)
    phases = ["backward"] * len(ops)
    sizes: dict[tuple[str, int], set[str]] = {}
    for i, op in enumerate(ops):
        if op == MISSING:
            continue
        around = [ranges.name(r)[suffix:] for r in ranges.around(op)]
        if any(a in _FORWARD for a in around):
            phases[i] = "forward"
            if "_pre_forward" not in around:
                continue
            at = int(np.searchsorted(starts, int(cols["ts"][op]), side="right")) - 1
            if at < 0:
                continue
            k = int(order[at]) + (1 if "_pre_forward_prefetch" in around else 0)
            units[i] = f"unit {k}"
            if inst.kind[i] == "all_gather":
                if inst.in_bytes[i] >= 0:
                    sizes.setdefault(("in", int(inst.in_bytes[i])), set()).add(units[i] or "")
                if inst.out_bytes[i] >= 0:
                    sizes.setdefault(("out", int(inst.out_bytes[i])), set()).add(units[i] or "")
    notes = []
    for i, op in enumerate(ops):
        if units[i] is not None or phases[i] != "backward" or op == MISSING:
            continue
        key = (
            ("in", int(inst.in_bytes[i])) if inst.kind[i] == "all_gather" else ("out", int(inst.in_bytes[i]))
        )
        found = sizes.get(key, set())
        if len(found) == 1 and key[1] >= 0:
            units[i] = next(iter(found))
    if any(u is None for u in units):
        notes.append(
            "FSDP1 names no module: units are numbered in forward order, and a backward collective whose "
            "message size matches no single forward unit is left without a unit"
        )
    return units, phases, notes


def fsdp_rank(data: RankData, inst: Instances) -> FsdpRank | None:
    """FSDP's units and steps on one rank (None when the trace shows no FSDP range)."""
    version = _version(data.table)
    if version is None:
        return None
    ranges = _Ranges(data.table, version)
    ops = _issuing_ops(data, inst)
    notes: list[str] = []
    if version == 2:
        placed = [_fsdp2_place(ranges, op) if op != MISSING else (None, "backward") for op in ops]
        units = [u for u, _ in placed]
        phases = [p for _, p in placed]
    else:
        units, phases, notes = _fsdp1_places(data, ranges, ops, inst)
    cols = data.table.columns
    at = np.array(
        [int(cols["ts"][op]) if op != MISSING else int(inst.issue[i]) for i, op in enumerate(ops)], np.int64
    )
    return _summarize(data, inst, version, units, phases, at, notes)


def _union(inst: Instances, idx: list[int]) -> iv.Intervals:
    ix = np.array(idx, dtype=np.int64)
    return iv.merge(inst.start[ix], inst.end[ix]) if len(ix) else iv.merge(ix, ix)


def _ms(ns: float) -> float:
    return round(ns / 1e6, 3)


def _bytes(inst: Instances, idx: list[int]) -> int | None:
    values = inst.in_bytes[np.array(idx, dtype=np.int64)]
    return int(values.sum()) if (values >= 0).all() else None


def _summarize(
    data: RankData,
    inst: Instances,
    version: int,
    units: list[str | None],
    phases: list[str],
    at: np.ndarray,
    notes: list[str],
) -> FsdpRank:
    steps = data.steps
    n = max(len(steps), 1)
    lo = steps.start if len(steps) else np.array([data.lo], np.int64)
    hi = steps.end if len(steps) else np.array([data.hi], np.int64)
    step_of = np.clip(np.searchsorted(lo, at, side="right") - 1, 0, len(lo) - 1)
    timed = inst.time_source is not None
    kinds = {k: [i for i, kind in enumerate(inst.kind) if kind == k] for k in KINDS}
    gathers = _union(inst, kinds["all_gather"])
    exposed = exposed_communication(data, gathers) if timed else None
    order: dict[str, int] = {}
    for i in sorted(
        kinds["all_gather"] + kinds["reduce_scatter"], key=lambda i: (phases[i] != "forward", at[i])
    ):
        if units[i] is not None:
            order.setdefault(units[i] or "", len(order))
    by_unit: dict[tuple[str, str], list[int]] = {}
    by_step: dict[tuple[str, int], list[int]] = {}
    for kind, idx in kinds.items():
        for i in idx:
            if units[i] is not None:
                by_unit.setdefault((kind, units[i] or ""), []).append(i)
            by_step.setdefault((kind, int(step_of[i])), []).append(i)
    out_units = []
    for name, index in order.items():
        ag, rs = by_unit.get(("all_gather", name), []), by_unit.get(("reduce_scatter", name), [])
        ag_b, rs_b = _bytes(inst, ag), _bytes(inst, rs)
        out_units.append(
            FsdpUnit(
                unit=name,
                index=index,
                all_gathers_per_step=round(len(ag) / n, 3),
                all_gather_bytes_per_step=None if ag_b is None else round(ag_b / n, 1),
                all_gather_ms_per_step=_ms(iv.length(_union(inst, ag)) / n) if timed else None,
                exposed_all_gather_ms_per_step=None
                if exposed is None
                else _ms(iv.length(iv.intersect(_union(inst, ag), exposed)) / n),
                reduce_scatters_per_step=round(len(rs) / n, 3),
                reduce_scatter_bytes_per_step=None if rs_b is None else round(rs_b / n, 1),
                reduce_scatter_ms_per_step=_ms(iv.length(_union(inst, rs)) / n) if timed else None,
            )
        )
    forward = [i for i in kinds["all_gather"] if phases[i] == "forward"]
    backward = [i for i in kinds["all_gather"] if phases[i] != "forward"]

    def covered(intervals: iv.Intervals | None) -> list[float | None]:
        if intervals is None:
            return [None] * len(lo)
        return [_ms(v) for v in iv.covered_within(intervals, lo, hi).tolist()]

    ag_ms, rs_ms = (
        covered(gathers if timed else None),
        covered(_union(inst, kinds["reduce_scatter"]) if timed else None),
    )
    ex_ms = covered(exposed)
    fw_ms = covered(None if exposed is None else iv.intersect(exposed, _union(inst, forward)))
    bw_ms = covered(None if exposed is None else iv.intersect(exposed, _union(inst, backward)))
    out_steps = []
    numbers = steps.number.tolist() if len(steps) else [0]
    for s, number in enumerate(numbers):
        ag, rs = by_step.get(("all_gather", s), []), by_step.get(("reduce_scatter", s), [])
        out_steps.append(
            FsdpStep(
                step=int(number),
                all_gathers=len(ag),
                all_gather_bytes=_bytes(inst, ag),
                all_gather_ms=ag_ms[s],
                exposed_all_gather_ms=ex_ms[s],
                exposed_forward_ms=fw_ms[s],
                exposed_backward_ms=bw_ms[s],
                reduce_scatters=len(rs),
                reduce_scatter_bytes=_bytes(inst, rs),
                reduce_scatter_ms=rs_ms[s],
            )
        )
    unattributed = sum(1 for k in KINDS for i in kinds[k] if units[i] is None)
    if not timed and len(inst):
        notes.append("the trace does not time the collectives: counts only")
    return FsdpRank(data.rank, version, inst.time_source, out_units, out_steps, unattributed, notes)


def combine_fsdp(ranks: list[FsdpRank | None]) -> FsdpAnalysis | None:
    """`analyze`'s `fsdp`: every FSDP rank (None when no rank shows FSDP)."""
    found = [r for r in ranks if r is not None]
    if not found:
        return None
    return FsdpAnalysis(max(r.version for r in found), found)
