"""The collective the job issued, behind what a backend ran: the c10d op (`c10d::_reduce_scatter_base_`) or
functional collective (`_c10d_functional::reduce_scatter_tensor`) that a backend range, a record_param_comms
or a kernel belongs to.

Backends run some collectives as others: gloo runs `c10d::_reduce_scatter_base_` as a `gloo:all_reduce` range
on its own thread, NCCL runs an all-to-all as SendRecv kernels. The issued op names the collective; the rules
are documented in docs/analysis.md ("Parallelism").

- An issued op is a c10d op or functional collective that no other one encloses on its thread (a functional
  collective calls the c10d op: one collective, not two).
- A range or kernel launch on the thread of an issued op, inside it, belongs to it.
- A CPU backend's range (gloo, mpi, ucc) runs on the backend's own thread after its op was issued: the ranges,
  by start, take the ops in the order they were issued (each backend thread serves its work queue in order),
  each the earliest op not yet taken that was issued before the range started and whose kind the range runs
  (its own kind, or one the backend runs as it: RUN_AS).
"""

from __future__ import annotations

import numpy as np

from stepscope.analysis.per_rank.comm_names import RUN_AS
from stepscope.analysis.read.table import MISSING, TraceTable


class IssuedOps:
    """The issued collective ops of one table (outermost c10d ops and functional collectives), per thread."""

    def __init__(self, table: TraceTable, rows: list[tuple[int, str, str]]) -> None:
        """`rows`: (row, source, kind) of the table's CPU collective events by start (collectives.cpu_rows)."""
        cols = self._cols = table.columns
        by_thread: dict[tuple[int, int], list[tuple[int, str]]] = {}
        for row, source, kind in rows:
            if source == "c10d_op":
                by_thread.setdefault((int(cols["pid"][row]), int(cols["tid"][row])), []).append((row, kind))
        self.rows: list[int] = []
        self.kind: dict[int, str] = {}
        self._threads: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, list[int]]] = {}
        for key, ops in by_thread.items():
            kept: list[int] = []
            reach = np.iinfo(np.int64).min
            for row, kind in ops:
                if int(cols["ts"][row]) < reach:
                    continue  # inside the previous op (a c10d op under its functional collective)
                kept.append(row)
                self.kind[row] = kind
                reach = int(cols["ts"][row] + cols["dur"][row])
            arr = np.array(kept, dtype=np.int64)
            self._threads[key] = (cols["ts"][arr], cols["ts"][arr] + cols["dur"][arr], kept)
            self.rows.extend(kept)
        self.rows.sort(key=lambda r: int(cols["ts"][r]))

    def __len__(self) -> int:
        return len(self.rows)

    def enclosing(self, row: int) -> int:
        """The issued op on `row`'s thread whose span holds `row`'s start, else -1."""
        if row == MISSING:
            return MISSING
        cols = self._cols
        found = self._threads.get((int(cols["pid"][row]), int(cols["tid"][row])))
        if found is None:
            return MISSING
        starts, ends, rows = found
        at = int(np.searchsorted(starts, cols["ts"][row], side="right")) - 1
        return rows[at] if at >= 0 and ends[at] > cols["ts"][row] else MISSING

    def enclosing_rows(self, rows: np.ndarray) -> np.ndarray:
        """`enclosing` of each row of `rows` (MISSING rows give MISSING), one binary search per thread."""
        rows = np.asarray(rows, dtype=np.int64)
        out = np.full(len(rows), MISSING, dtype=np.int64)
        known = np.flatnonzero(rows != MISSING)
        if not len(known) or not self._threads:
            return out
        cols = self._cols
        pid, tid, ts = cols["pid"][rows[known]], cols["tid"][rows[known]], cols["ts"][rows[known]]
        for (p, t), (starts, ends, kept) in self._threads.items():
            mine = np.flatnonzero((pid == p) & (tid == t))
            if not len(mine):
                continue
            at = np.searchsorted(starts, ts[mine], side="right") - 1
            inside = (at >= 0) & (ends[np.maximum(at, 0)] > ts[mine])
            out[known[mine[inside]]] = np.asarray(kept, dtype=np.int64)[at[inside]]
        return out

    def pair_ranges(self, ranges: list[tuple[int, str, str]]) -> dict[int, int]:
        """Range row -> op row for CPU backend ranges (row, source, kind), by the rule in the module doc."""
        ts = self._cols["ts"]
        pending: dict[str, list[int]] = {}
        for row in self.rows:
            pending.setdefault(self.kind[row], []).append(row)
        head = dict.fromkeys(pending, 0)
        taken: set[int] = set()
        out: dict[int, int] = {}
        for row, _, kind in sorted(ranges, key=lambda r: int(ts[r[0]])):
            best = MISSING
            for issued in (kind, *(i for i, ran in RUN_AS if ran == kind)):
                ops = pending.get(issued, [])
                at = head.get(issued, 0)
                while at < len(ops) and ops[at] in taken:
                    at += 1
                head[issued] = at
                if at < len(ops) and ts[ops[at]] <= ts[row] and (best == MISSING or ts[ops[at]] < ts[best]):
                    best = ops[at]
            if best != MISSING:
                taken.add(best)
                out[row] = best
        return out
