"""The trace model: every event of every loaded rank in one columnar table (no torch, no pandas).

One row per trace event (complete 'X', instant 'i', flow 's'/'f', counter 'C'; metadata 'M' events are
left out); what a file says about its rank (`distributedInfo`, `deviceProperties`) is its `RankInfo`. Names
and categories are interned: `name` / `cat` hold indices into `names` / `cats`. Times are integer
**nanoseconds** (Kineto writes microseconds, sometimes with a ns fraction). Categories of the old 2021
schema (`Operator`, `Runtime`, `Kernel`, `Memcpy`, `Memset`) are mapped onto the current ones (`cpu_op`,
`cuda_runtime`, `kernel`, `gpu_memcpy`, `gpu_memset`) when the table is built.
"""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

import msgspec
import numpy as np

from stepscope.analysis.read.derived import DerivedRows

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
        "args.bytes of GPU activities (memcpy/memset; collective kernels when given), else -1 (sparse)",
    ),
}

# String-valued args kept per row as an index into `names` (-1 when absent): "args_<key>" columns (sparse).
STRING_ARGS: dict[str, str] = {
    "collective": "Collective name",  # record_param_comms and NCCL kernels
    "dtype": "dtype",
    "pg_name": "Process Group Name",
    "pg_desc": "Process Group Description",
    "pg_ranks": "Process Group Ranks",  # a text: "[0, 1]"
    # all_to_all(v): rows of the tensor sent to / received from each rank of the group, a text: "[3, 5]" ("[]":
    # even splits). On gloo's c10d::alltoall_base_ / all_to_all_single, read from their recorded inputs
    "in_split": "In split size",
    "out_split": "Out split size",
}
# Integer args kept per row (-1 when absent; sparse). On gloo/mpi/ucc ranges (`gloo:all_reduce`) without them,
# `args_in_nelems` / `args_dtype` come from the recorded shapes instead (see shapes_message).
INT_ARGS: dict[str, str] = {
    "in_nelems": "In msg nelems",
    "out_nelems": "Out msg nelems",
    "group_size": "Group size",
}
# Integer columns read from the recorded inputs (record_shapes=True) of a few ops (-1 when absent; sparse).
SHAPE_INT_ARGS: dict[str, str] = {
    # the rank (in the op's process group) a c10d::send sends to or a c10d::recv_ receives from: the op's
    # third input, `Concrete Inputs` [tensors, group, peer, tag]
    "peer": "Concrete Inputs",
}
# Integer args read only on the `cuda_sync` events of newer Kineto traces (-1 when absent; sparse): a stream wait's
# or an event synchronize's event, by the stream it was recorded on and the correlation id of its cudaEventRecord
# call.
SYNC_INT_ARGS: dict[str, str] = {
    "wait_stream": "wait_on_stream",
    "wait_record": "wait_on_cuda_event_record_corr_id",
}
SYNC_CATEGORY = "cuda_sync"
# Int64 args columns of the table.
INT64_ARGS = (*INT_ARGS, *SHAPE_INT_ARGS, *SYNC_INT_ARGS)
# Columns -1 on almost every row, kept as a SparseColumn (the rows that have a value, and the values): the
# args of collectives and the bytes of GPU memory activities.
SPARSE_COLUMNS = frozenset({"bytes", *(f"args_{k}" for k in (*STRING_ARGS, *INT64_ARGS))})
# Args read only on the ranges a CPU communication backend opens around each collective (`gloo:all_reduce`):
# traces recorded with record_shapes give their tensors there, the only message size gloo leaves; and on the
# point-to-point c10d ops (P2P_OPS), whose peer only their concrete inputs give.
RAW_ARGS: dict[str, str] = {
    "input_dims": "Input Dims",
    "input_type": "Input type",
    "concrete_inputs": "Concrete Inputs",
}


class SparseColumn:
    """An integer column that is -1 (MISSING) but on a few rows: those rows, ascending, and their values.

    It reads like the numpy column it stands for: `column[row]` is a value, `column[rows]` (an array of row
    numbers) a numpy array, np.asarray(column) the whole column, comparisons give boolean arrays. A boolean
    mask or a slice gives a SparseColumn of the rows kept (what `TraceTable.select` does to every column)."""

    __slots__ = ("_at", "n", "rows", "values")
    __hash__ = None  # type: ignore[assignment]
    ndim = 1

    def __init__(self, n: int, rows: np.ndarray, values: np.ndarray) -> None:
        self._at: dict[int, Any] | None = None  # row -> value, for reading one row at a time
        self.n = int(n)
        self.rows = np.asarray(rows, dtype=np.int64)
        self.values = np.asarray(values)
        if len(self.rows) > 1 and (np.diff(self.rows) <= 0).any():
            order = np.argsort(self.rows, kind="stable")
            self.rows, self.values = self.rows[order], self.values[order]

    @classmethod
    def of(cls, dense: np.ndarray) -> SparseColumn:
        rows = np.flatnonzero(dense != MISSING)
        return cls(len(dense), rows, dense[rows])

    @property
    def dtype(self) -> np.dtype[Any]:
        return self.values.dtype

    @property
    def shape(self) -> tuple[int]:
        return (self.n,)

    @property
    def size(self) -> int:
        return self.n

    @property
    def nbytes(self) -> int:
        return int(self.rows.nbytes + self.values.nbytes)

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        return f"SparseColumn(n={self.n}, {len(self.rows)} set, dtype={self.dtype})"

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = np.full(self.n, MISSING, dtype=self.dtype)
        out[self.rows] = self.values
        return out if dtype is None else out.astype(dtype, copy=False)

    def tolist(self) -> list[Any]:
        return np.asarray(self).tolist()

    def astype(self, dtype: Any, copy: bool = True) -> SparseColumn:
        if not copy and np.dtype(dtype) == self.dtype:
            return self
        return SparseColumn(self.n, self.rows, self.values.astype(dtype))

    def map(self, lookup: np.ndarray) -> SparseColumn:
        """The column with each value v replaced by lookup[v] (codes renumbered)."""
        return SparseColumn(self.n, self.rows, lookup[self.values])

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, (int, np.integer)):
            row = int(key) + self.n if key < 0 else int(key)
            if not 0 <= row < self.n:
                raise IndexError(f"index {int(key)} is out of bounds for a column of {self.n} rows")
            at = getattr(self, "_at", None)  # (unset in a column unpickled from an older stepscope)
            if at is None:
                at = self._at = dict(zip(self.rows.tolist(), self.values, strict=True))
            return at.get(row, self.dtype.type(MISSING))
        if isinstance(key, slice):
            start, stop, step = key.indices(self.n)
            if step != 1:
                return np.asarray(self)[key]
            stop = max(stop, start)
            lo, hi = np.searchsorted(self.rows, [start, stop])
            return SparseColumn(stop - start, self.rows[lo:hi] - start, self.values[lo:hi])
        key = np.asarray(key)
        if key.dtype == bool:
            if key.shape != (self.n,):
                raise IndexError(f"a mask of {key.shape} for a column of {self.n} rows")
            kept = key[self.rows]
            new_rows = np.cumsum(key, dtype=np.int64)[self.rows[kept]] - 1
            return SparseColumn(int(np.count_nonzero(key)), new_rows, self.values[kept])
        rows = np.where(key < 0, key + self.n, key).astype(np.int64)
        if len(rows) and (rows.min() < 0 or rows.max() >= self.n):
            raise IndexError(f"an index out of bounds for a column of {self.n} rows")
        if not len(self.rows):
            return np.full(key.shape, MISSING, dtype=self.dtype)
        at = np.minimum(np.searchsorted(self.rows, rows), len(self.rows) - 1)
        return np.where(self.rows[at] == rows, self.values[at], self.dtype.type(MISSING))

    def _compare(self, other: Any, op: Any) -> np.ndarray:
        return op(np.asarray(self), np.asarray(other) if isinstance(other, SparseColumn) else other)  # type: ignore[no-any-return]

    def __eq__(self, other: Any) -> np.ndarray:  # type: ignore[override]
        return self._compare(other, np.equal)

    def __ne__(self, other: Any) -> np.ndarray:  # type: ignore[override]
        return self._compare(other, np.not_equal)

    def __lt__(self, other: Any) -> np.ndarray:
        return self._compare(other, np.less)

    def __le__(self, other: Any) -> np.ndarray:
        return self._compare(other, np.less_equal)

    def __gt__(self, other: Any) -> np.ndarray:
        return self._compare(other, np.greater)

    def __ge__(self, other: Any) -> np.ndarray:
        return self._compare(other, np.greater_equal)


def constant_column(value: Any, n: int, dtype: Any) -> np.ndarray:
    """A column of `n` rows that all hold `value`, in no memory: a read-only view of one value (stride 0).

    Columns that hold one value over a whole table are common (the rank of a one-rank file; pid, tid,
    stream, device and correlation of a CPU-only trace) and would cost up to 8 bytes a row. The view reads
    like any column: indexing, masks, comparisons and arithmetic give ordinary arrays; writing raises."""
    return np.broadcast_to(np.array(value, dtype=dtype), (n,))


def constant_value(column: Any) -> Any:
    """The value of a `constant_column` (a numpy scalar), else None. Other columns are not scanned: this says
    how a column is kept, not what it holds."""
    if isinstance(column, np.ndarray) and column.ndim == 1 and column.strides == (0,) and len(column):
        return column[0]
    return None


def concatenate_columns(parts: list[Any]) -> Any:
    """np.concatenate of columns, SparseColumns staying sparse and constant columns of one value constant."""
    values = [constant_value(p) for p in parts]
    if parts and all(v is not None and v == values[0] for v in values):
        return constant_column(values[0], sum(len(p) for p in parts), parts[0].dtype)
    if not any(isinstance(p, SparseColumn) for p in parts):
        return np.concatenate(parts)
    sparse = [p if isinstance(p, SparseColumn) else SparseColumn.of(p) for p in parts]
    offsets = np.cumsum([0, *(p.n for p in sparse)])
    return SparseColumn(
        int(offsets[-1]),
        np.concatenate([p.rows + at for p, at in zip(sparse, offsets[:-1].tolist(), strict=True)]),
        np.concatenate([p.values for p in sparse]),
    )


class RankInfo(msgspec.Struct):
    """What the file of one rank says about itself."""

    rank: int
    source: str  # path of the file
    rank_assigned: bool = False  # True when the file had no distributedInfo.rank and stepscope chose one
    world_size: int | None = None
    backend: str | None = None
    device_properties: list[dict[str, Any]] = msgspec.field(default_factory=list)
    # distributedInfo.pg_config: the rank's process groups, {pg_name, pg_desc, pg_size, ranks, ...} each
    process_groups: list[dict[str, Any]] = msgspec.field(default_factory=list)
    merge_header: Any = None  # a merged trace's `stepscopeMerge` (the loader splits it into its ranks)


class TraceTable(msgspec.Struct, eq=False):
    """Columnar events of one or more ranks. All columns have the same length; see COLUMNS. Columns are
    read-only to the analyses: a column of one value may be a `constant_column`, a sparse one a
    SparseColumn."""

    names: list[str]
    cats: list[str]
    columns: dict[str, np.ndarray]
    ranks: dict[int, RankInfo] = msgspec.field(default_factory=dict)
    notices: list[str] = msgspec.field(default_factory=list)
    # per-symbol results (see names_matching), shared by the tables `select` makes: they share `names`
    symbol_cache: dict[Any, tuple[np.ndarray, np.ndarray]] = msgspec.field(default_factory=dict)
    # what analyses derive from this table's rows, computed once (see derived.py); not shared by `select`
    derived: DerivedRows = msgspec.field(default_factory=DerivedRows)

    def __len__(self) -> int:
        return len(self.columns["ts"])

    # --- symbol helpers ---------------------------------------------------------------------------
    def cat_id(self, category: str) -> int:
        """Index of a category, or -1 when no event has it."""
        try:
            return self.cats.index(category)
        except ValueError:
            return MISSING

    def cat_mask(self, *categories: str) -> np.ndarray:
        """Which rows are events of one of `categories`."""
        ids = [i for i in (self.cat_id(c) for c in categories) if i != MISSING]
        if not ids:
            return np.zeros(len(self), dtype=bool)
        lookup = np.zeros(len(self.cats) + 1, dtype=bool)  # by category code; the last is -1 (none)
        lookup[ids] = True
        return lookup[self.columns["cat"]]  # type: ignore[no-any-return]

    def complete_rows(self, *categories: str) -> np.ndarray:
        """The rows of the complete ('X') events of `categories`, ascending (computed once per table and
        categories; read-only)."""
        rows = self.derived.complete_rows.get(categories)
        if rows is None:
            rows = np.flatnonzero(self.cat_mask(*categories) & (self.columns["ph"] == ord("X")))
            if len(self) < 2**31:
                rows = rows.astype(np.int32)
            rows.flags.writeable = False
            self.derived.complete_rows[categories] = rows
        return rows  # type: ignore[no-any-return]

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
        n = int(np.count_nonzero(mask)) if mask.dtype == bool else None
        key: Any = mask
        # a few rows (one rank of many) that are one run are taken as a slice: a sparse column's rows are then
        # found by searching, not by a cumsum over the whole table per column
        if n and mask.dtype == bool and len(mask) > 4 * n:
            first = int(np.argmax(mask))
            if mask[first : first + n].all():
                key = slice(first, first + n)
        return TraceTable(
            self.names,
            self.cats,
            {k: _rows_of_column(v, key, n) for k, v in self.columns.items()},
            self.ranks,
            self.notices,
            self.symbol_cache,
        )

    def rank_ids(self) -> list[int]:
        return sorted(self.ranks) if self.ranks else sorted(set(self.columns["rank"].tolist()))


def _rows_of_column(column: Any, mask: Any, kept: int | None) -> Any:
    """column[mask] (a boolean mask, or a slice of the same rows); a constant column stays one (`kept`: the
    rows of a boolean mask)."""
    value = constant_value(column)
    if value is not None and kept is not None:
        return constant_column(value, kept, column.dtype)
    if isinstance(mask, slice) and isinstance(column, np.ndarray):
        return column[mask].copy()  # (a copy, as a mask gives: a view would keep the whole column alive)
    return column[mask]


def as_int(value: Any) -> int:
    """An int64 arg value, or -1 (absent, not a number, or beyond int64: some traces carry such ids)."""
    if isinstance(value, bool) or value is None:
        return MISSING
    if isinstance(value, int):
        return value if -(2**63) <= value < 2**63 else MISSING
    if isinstance(value, float) and value == value and abs(value) < 2**63:
        return int(value)
    if isinstance(value, Decimal) and value.is_finite():  # read like the loader: through float64
        return as_int(float(value))
    return MISSING


def id_as_int(value: Any) -> int:
    """pid / tid: ints as they are; old traces write tids as strings ('5555', 'stream 7')."""
    if isinstance(value, str):
        digits = value[7:] if value.startswith("stream ") else value
        if digits.isdecimal() and digits.isascii() and len(digits) < 19:
            return int(digits)
        return MISSING
    return as_int(value)


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
