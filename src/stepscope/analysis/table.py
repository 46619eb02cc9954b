"""The trace model: every event of every loaded rank in one columnar table (no torch, no pandas).

One row per trace event (complete 'X', instant 'i', flow 's'/'f', counter 'C'; metadata 'M' events are
left out); what a file says about its rank (`distributedInfo`, `deviceProperties`) is its `RankInfo`. Names
and categories are interned: `name` / `cat` hold indices into `names` / `cats`. Times are integer
**nanoseconds** (Kineto writes microseconds, sometimes with a ns fraction). Categories of the old 2021
schema (`Operator`, `Runtime`, `Kernel`, `Memcpy`, `Memset`) are mapped onto the current ones (`cpu_op`,
`cuda_runtime`, `kernel`, `gpu_memcpy`, `gpu_memset`) when the table is built.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

import numpy as np

# Old (torch 1.8/1.9 era) Kineto category names -> current names.
OLD_CATEGORIES: dict[str, str] = {
    "Operator": "cpu_op",
    "Runtime": "cuda_runtime",
    "Kernel": "kernel",
    "Memcpy": "gpu_memcpy",
    "Memset": "gpu_memset",
    "Python": "python_function",
    "User annotation": "user_annotation",
    "user annotation": "user_annotation",
    "gpu user annotation": "gpu_user_annotation",
}

# Categories of events that run on a GPU stream (their `stream` column is set).
GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})

# Integer columns of the table and the value meaning "absent".
MISSING = -1

# Columns: name -> (numpy dtype, meaning).
COLUMNS: dict[str, tuple[str, str]] = {
    "rank": ("int32", "rank of the file the event came from"),
    "ph": ("uint8", "ord() of the chrome-trace phase letter: X, i, s, f, C, b, e, ..."),
    "cat": ("int32", "index into `cats` (normalised category); -1 when the event has none"),
    "name": ("int32", "index into `names`"),
    "pid": ("int64", "process id (GPU events: device index); numeric strings parsed; else -1"),
    "tid": ("int64", "thread id (GPU events: stream); '5555' -> 5555, 'stream 7' -> 7; else -1"),
    "ts": ("int64", "start, integer ns since the epoch of the trace clock"),
    "dur": ("int64", "duration in ns; 0 for events without one"),
    "stream": ("int32", "args.stream of GPU events, else -1"),
    "device": ("int32", "args.device of GPU events, else -1"),
    "correlation": ("int64", "args.correlation (runtime call <-> GPU activity), else -1"),
    "bytes": (
        "int64",
        "args.bytes of GPU activities (memcpy/memset; collective kernels when given), else -1",
    ),
}

# String-valued args kept per row as an index into `names` (-1 when absent): "args_<key>" columns.
STRING_ARGS: dict[str, str] = {
    "collective": "Collective name",  # record_param_comms and NCCL kernels
    "dtype": "dtype",
    "pg_name": "Process Group Name",
}
# Integer args kept per row (-1 when absent). On gloo/mpi/ucc ranges (`gloo:all_reduce`) without them,
# `args_in_nelems` / `args_dtype` come from the recorded shapes instead (see shapes_message).
INT_ARGS: dict[str, str] = {
    "in_nelems": "In msg nelems",
    "out_nelems": "Out msg nelems",
    "group_size": "Group size",
}
# Args read only on the ranges a CPU communication backend opens around each collective (`gloo:all_reduce`):
# traces recorded with record_shapes give their tensors there, the only message size gloo leaves.
RAW_ARGS: dict[str, str] = {"input_dims": "Input Dims", "input_type": "Input type"}
# (NCCL's ranges need not: record_param_comms and the kernels carry the sizes.)
SHAPED_RANGE_RE = re.compile(r"^(?:gloo|mpi|ucc):")


def shapes_message(dims: Any, types: Any) -> tuple[int, str | None] | None:
    """(elements, dtype) of the tensors listed in a backend range's `Input Dims` / `Input type`.

    `dims` holds one entry per input: a tensor's shape (a list of ints) or a tensor list's shapes (a list of
    lists). The elements of every tensor add up; the dtype is the first input's type when it names an element
    type (not `TensorList`). None when `dims` lists no tensor. This is the `In msg nelems` / `dtype` of such a
    range when its args have none (see docs/analysis.md, "Collectives")."""
    if not isinstance(dims, list):
        return None
    total = 0
    tensors = 0
    for entry in dims:
        shapes = entry if entry and all(isinstance(x, list) for x in entry) else [entry]
        for shape in shapes:
            if not isinstance(shape, list) or not shape or not all(type(x) is int and x >= 0 for x in shape):
                continue
            size = 1
            for x in shape:
                size *= x
            total += size
            tensors += 1
    if not tensors or total >= 2**62:
        return None
    dtype = None
    first = types[0] if isinstance(types, list) and types else None
    if isinstance(first, str) and first and first not in ("TensorList", "Tensor", "Scalar", "ScalarList"):
        dtype = first
    return total, dtype


@dataclass
class RankInfo:
    """What the file of one rank says about itself."""

    rank: int
    source: str  # path of the file
    rank_assigned: bool = False  # True when the file had no distributedInfo.rank and stepscope chose one
    world_size: int | None = None
    backend: str | None = None
    device_properties: list[dict[str, Any]] = field(default_factory=list)
    merge_header: Any = None  # a merged trace's `stepscopeMerge` (the loader splits it into its ranks)


@dataclass
class TraceTable:
    """Columnar events of one or more ranks. All columns have the same length; see COLUMNS."""

    names: list[str]
    cats: list[str]
    columns: dict[str, np.ndarray]
    ranks: dict[int, RankInfo] = field(default_factory=dict)
    notices: list[str] = field(default_factory=list)
    # per-symbol results (see names_matching), shared by the tables `select` makes: they share `names`
    symbol_cache: dict[Any, tuple[np.ndarray, np.ndarray]] = field(
        default_factory=dict, repr=False, compare=False
    )
    # results about this table's rows computed once (see summary.self_times); not shared by `select`
    row_cache: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.columns["ts"])

    def __getattr__(self, item: str) -> np.ndarray:
        columns = self.__dict__.get("columns")
        if columns is not None and item in columns:
            return columns[item]
        raise AttributeError(item)

    # --- symbol helpers ---------------------------------------------------------------------------
    def cat_id(self, category: str) -> int:
        """Index of a category, or -1 when no event has it."""
        try:
            return self.cats.index(category)
        except ValueError:
            return MISSING

    def cat_mask(self, *categories: str) -> np.ndarray:
        ids = [i for i in (self.cat_id(c) for c in categories) if i != MISSING]
        return np.isin(self.columns["cat"], ids) if ids else np.zeros(len(self), dtype=bool)

    def name_of(self, row: int) -> str:
        return self.names[int(self.columns["name"][row])]

    def names_matching(self, predicate: Any, key: Any = None, among: np.ndarray | None = None) -> np.ndarray:
        """Boolean mask over the symbol table: which names satisfy `predicate(str)` (see name_values for
        `key` and `among`)."""
        return self.name_values(lambda n: bool(predicate(n)), bool, key, among)

    def name_values(
        self, function: Any, dtype: Any, key: Any = None, among: np.ndarray | None = None
    ) -> np.ndarray:
        """`function(name)` of the names of the symbol table, as an array indexed by name code.

        `among`: name codes (those of the rows at hand); only these names are evaluated, the others read as
        0 / False. `key` (standing for `function`): each name is evaluated once for all the tables sharing
        this symbol table (the ranks of one load); names never change after a load, so neither does this."""
        n = len(self.names)
        entry = self.symbol_cache.get(key) if key is not None else None
        if entry is None or len(entry[0]) != n:
            entry = (np.zeros(n, dtype=dtype), np.zeros(n, dtype=bool))  # values, evaluated
            if key is not None:
                self.symbol_cache[key] = entry
        values, done = entry
        if among is None:
            todo = np.flatnonzero(~done)
        else:  # (a mask, not np.unique: numpy 2's unique imports numpy.ma, 16 ms, on its first call)
            present = np.zeros(n, dtype=bool)
            present[among[among >= 0]] = True
            todo = np.flatnonzero(present & ~done)
        if len(todo):
            values[todo] = [function(self.names[i]) for i in todo.tolist()]
            done[todo] = True
        return values  # type: ignore[no-any-return]

    def select(self, mask: np.ndarray) -> TraceTable:
        """A table of the rows where `mask` is true (symbol tables, and what is cached about them, shared)."""
        return TraceTable(
            self.names,
            self.cats,
            {k: v[mask] for k, v in self.columns.items()},
            self.ranks,
            self.notices,
            self.symbol_cache,
        )

    def rank_ids(self) -> list[int]:
        return sorted(self.ranks) if self.ranks else sorted(set(self.columns["rank"].tolist()))


def _as_int(value: Any) -> int:
    """An int64 arg value, or -1 (absent, not a number, or beyond int64: some traces carry such ids)."""
    if isinstance(value, bool) or value is None:
        return MISSING
    if isinstance(value, int):
        return value if -(2**63) <= value < 2**63 else MISSING
    if isinstance(value, float) and value == value and abs(value) < 2**63:
        return int(value)
    if isinstance(value, Decimal) and value.is_finite():  # read like the loader: through float64
        return _as_int(float(value))
    return MISSING


def _id_as_int(value: Any) -> int:
    """pid / tid: ints as they are; old traces write tids as strings ('5555', 'stream 7')."""
    if isinstance(value, str):
        digits = value[7:] if value.startswith("stream ") else value
        if digits.isdecimal() and digits.isascii() and len(digits) < 19:
            return int(digits)
        return MISSING
    return _as_int(value)


_INT64_MAX = 2**63 - 1
OUT_OF_RANGE_NS = _INT64_MAX  # a time too large for int64 ns: the loader refuses the file


def decimal_us_to_ns(value: Decimal) -> int:
    """Exact microseconds -> ns, rounded half to even; 0 for non-finite values, +-int64 max out of range."""
    if not value.is_finite():
        return 0
    if abs(value) >= 10**16:
        return _clipped(value)
    ns = int((value.scaleb(3)).quantize(Decimal(1), rounding=ROUND_HALF_EVEN))
    return ns if -_INT64_MAX <= ns <= _INT64_MAX else _clipped(ns)


def _clipped(value: Any) -> int:
    return OUT_OF_RANGE_NS if value > 0 else -OUT_OF_RANGE_NS
