"""A file's table and the stretches it is built from: `FileTable` (one file's columns with its own symbols),
`PartTable` (the columns of a stretch of a file, in memory or spilled to files) and `join_parts`, which makes one
file's table of its stretches in file order (a whole-file builder's table is its one part)."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from stepscope.analysis.read.table import (
    COLUMNS,
    INT64_ARGS,
    MISSING,
    SPARSE_COLUMNS,
    STRING_ARGS,
    RankInfo,
    SparseColumn,
    constant_column,
    constant_value,
)

# Columns of a FileTable and their dtypes (the TraceTable's, less `rank`, which the merge adds).
_DTYPES: dict[str, str] = {
    **{c: d for c, (d, _) in COLUMNS.items() if c != "rank"},
    **{f"args_{k}": "int32" for k in STRING_ARGS},
    **{f"args_{k}": "int64" for k in INT64_ARGS},
}
# Columns that are -1 on most rows: kept per chunk as (rows, values) and filled in at the end.
_SPARSE = frozenset({"stream", "device", "bytes", *(f"args_{k}" for k in (*STRING_ARGS, *INT64_ARGS))})
# Dense columns that often hold one value over a whole file (the phase and category of a CPU-only trace's
# events; pid and tid of one process and thread; correlation without GPU work): kept as that value until a
# chunk holds another, and as a constant_column in the end (no memory per row).
_OFTEN_CONSTANT = frozenset({"ph", "cat", "pid", "tid", "correlation"})


class FileTable(msgspec.Struct):
    """One file's columns with its own symbol tables (merged into the TraceTable afterwards)."""

    path: str
    names: list[str]
    cats: list[str]
    columns: dict[str, np.ndarray]
    info: RankInfo
    declared_rank: int | None
    notices: list[str] = msgspec.field(default_factory=list)


class SpilledColumn(msgspec.Struct):
    """A dense column written to a file (raw values of `dtype`, `rows` of them)."""

    path: str
    dtype: str
    rows: int


class SparsePieces(msgspec.Struct):
    """A column that is -1 but on the rows of its (rows, values) pieces."""

    pieces: list[tuple[np.ndarray, np.ndarray]]


class PartTable(msgspec.Struct):
    """The columns of a stretch of a file's events with the symbols of that stretch: `names` (event names),
    `cats`, and by string arg the strings its `args_<key>` column indexes. Columns are arrays, or (from a
    spilling builder) SpilledColumn / SparsePieces."""

    names: list[str]
    cats: list[str]
    arg_strings: dict[str, list[str]]
    columns: dict[str, Any]
    n_events: int
    n_rows: int


def join_parts(path: str, parts: list[PartTable], info: RankInfo, rank_hint: int | None) -> FileTable:
    """One file's table from the tables of its stretches, in file order: the same table one builder reading
    the whole file gives (symbols numbered in order of first appearance; arg strings after every event name,
    key by key). Each column is allocated once and filled part by part; the parts' columns are freed (their
    files read) as they are joined."""
    names: dict[str, int] = {}
    cats: dict[str, int] = {}
    name_maps = [np.array([names.setdefault(s, len(names)) for s in p.names], dtype=np.int32) for p in parts]
    cat_maps = [np.array([cats.setdefault(s, len(cats)) for s in p.cats], dtype=np.int32) for p in parts]
    arg_maps: dict[str, list[np.ndarray]] = {}
    for key in STRING_ARGS:
        arg_maps[key] = [
            np.array([names.setdefault(s, len(names)) for s in p.arg_strings[key]], dtype=np.int32)
            for p in parts
        ]
    maps: dict[str, list[np.ndarray]] = {"name": name_maps, "cat": cat_maps}
    maps |= {f"args_{key}": value for key, value in arg_maps.items()}
    total = sum(p.n_rows for p in parts)
    columns: dict[str, np.ndarray] = {}
    for key, dtype in _DTYPES.items():
        if key in SPARSE_COLUMNS:
            pieces = [(p.columns.pop(key), p.n_rows) for p in parts]
            columns[key] = _joined_sparse(pieces, maps.get(key), dtype)  # type: ignore[assignment]  # reads as one
            continue
        first = parts[0].columns[key] if len(parts) == 1 else None
        if isinstance(first, np.ndarray):  # one part in memory: its column as it is, mapped if need be
            column = parts[0].columns.pop(key)
            if key in maps:
                column = _mapped(column, maps[key][0])
            columns[key] = column.astype(dtype, copy=False)
            continue
        out = np.full(total, MISSING, dtype=dtype) if key in _SPARSE else np.empty(total, dtype=dtype)
        at = 0
        for i, p in enumerate(parts):
            _fill(out, at, p.columns.pop(key))
            if key in maps:
                view = out[at : at + p.n_rows]
                view[:] = _mapped(view, maps[key][i])
            at += p.n_rows
        columns[key] = _as_constant(out) if key in _OFTEN_CONSTANT or key in _SPARSE else out
    declared = info.rank if info.rank != MISSING else rank_hint
    return FileTable(path, list(names), list(cats), columns, info, declared)


def _sparse_column(n: int, pieces: list[tuple[np.ndarray, np.ndarray]], dtype: str) -> SparseColumn:
    """A SparseColumn of `n` rows from (rows, values) pieces."""
    if not pieces:
        return SparseColumn(n, np.zeros(0, np.int64), np.zeros(0, dtype=dtype))
    rows = np.concatenate([r for r, _ in pieces])
    values = np.concatenate([v for _, v in pieces]).astype(dtype, copy=False)
    return SparseColumn(n, rows, values)


def _joined_sparse(parts: list[tuple[Any, int]], maps: list[np.ndarray] | None, dtype: str) -> SparseColumn:
    """One SparseColumn from the parts' columns (in memory: SparseColumn; spilled: SparsePieces) and their
    numbers of rows, string codes mapped."""
    pieces: list[tuple[np.ndarray, np.ndarray]] = []
    at = 0
    for i, (column, n_rows) in enumerate(parts):
        if isinstance(column, SparsePieces):
            column = _sparse_column(n_rows, column.pieces, dtype)
        values = column.values.astype(dtype, copy=False)
        if maps is not None and len(values):
            values = _mapped(values, maps[i])
        pieces.append((column.rows + at, values))
        at += n_rows
    return _sparse_column(at, pieces, dtype)


def _fill(out: np.ndarray, at: int, column: Any) -> None:
    """Write one part's column into `out` from row `at`."""
    if isinstance(column, SpilledColumn):
        view = out[at : at + column.rows]
        with open(column.path, "rb") as fh:
            got = fh.readinto(view.view(np.uint8).data)
        if got != view.nbytes:
            raise OSError(f"{column.path}: {got} of {view.nbytes} bytes")
    elif isinstance(column, SparsePieces):
        for rows, values in column.pieces:
            out[rows + at] = values
    else:
        out[at : at + len(column)] = column


def _as_constant(column: np.ndarray) -> np.ndarray:
    """The column as a constant_column when it holds one value (its rows freed), else as it is."""
    if len(column) and bool((column == column[0]).all()):
        return constant_column(column[0], len(column), column.dtype)
    return column


def _mapped(codes: np.ndarray, mapping: np.ndarray) -> np.ndarray:
    """`mapping[codes]`, -1 staying -1; the codes themselves when `mapping` is the identity (or empty: every
    code is then -1)."""
    if np.array_equal(mapping, np.arange(len(mapping))):
        return codes
    value = constant_value(codes)
    if value is not None:
        return constant_column(MISSING if value == MISSING else mapping[value], len(codes), codes.dtype)
    return np.append(mapping, np.int32(MISSING))[codes]
