"""The decoded table of a trace file, kept for the next command that reads the file (issue 48, item 5).

The first load of a file writes its FileTable to the user's cache folder (STEPSCOPE_CACHE_DIR, else
$XDG_CACHE_HOME/stepscope, else ~/.cache/stepscope; under `tables/`); a later load of the same file maps it back
instead of decoding the JSON again. The format runs no code when read: a fixed magic line, the length of a JSON
header, the header (symbol tables, the rank's facts, each column's kind, dtype and place) and the columns' raw
bytes, each at a 64-byte boundary, mapped read-only (columns are read-only to the analyses anyway). Only numeric
dtypes are written or read.

A file is known by its key (`read/cache`'s): its absolute path, size, modification time and a hash of its
first and last 64 KiB, the code that reads it (stepscope's files and version) and the loader's options (rank
hint, flows). A changed file gets a new key; a cache file
that does not read back whole (a wrong magic, a header that does not decode, a column past the end, a dtype that
is not numeric) is removed and the trace decoded again. The folder is kept under STEPSCOPE_CACHE_MAX_MB (default
2048): the least recently used files go first. STEPSCOPE_NO_CACHE=1 (`--no-cache`) neither reads nor writes it.
Nothing here ever fails a load: a cache that cannot be written or read is skipped.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from stepscope.analysis.read._parts import FileTable
from stepscope.analysis.read.cache import (
    base,
    blake2b,
    code_key,
    enabled,
    evict,
    hash_file,
    kept_env,
    max_bytes,
)
from stepscope.analysis.read.table import RankInfo, SparseColumn, constant_column, constant_value

MAGIC = b"stepscope-table/1\n"
_ALIGN = 64
_NUMERIC = frozenset("biuf")  # numpy dtype kinds written and read
__all__ = ["cached_load", "file_key", "folder", "read", "write"]


class _Column(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    kind: str  # dense | constant | sparse
    dtype: str
    n: int
    offset: int = 0  # dense: the values; sparse: the rows (int64)
    offset2: int = 0  # sparse: the values
    set_rows: int = 0  # sparse: how many rows hold a value
    value: float | int | bool | None = None  # constant


class _Header(msgspec.Struct, forbid_unknown_fields=True):
    path: str
    names: list[str]
    cats: list[str]
    info: RankInfo
    declared_rank: int | None
    notices: list[str]
    columns: list[_Column]


def folder() -> Path:
    return base() / "tables"


def cached_load(path: Path, rank_hint: int | None, flows: bool, load: Callable[[], FileTable]) -> FileTable:
    """The FileTable of `path` from the cache, else `load()`'s (then kept in the cache)."""
    if not enabled():
        return load()
    try:
        key = file_key(path, rank_hint, flows)
    except (OSError, RuntimeError):  # (RuntimeError: a loop of symbolic links; the load says what is wrong)
        return load()
    where = folder() / f"{key}.table"
    table = read(where)
    if table is not None:
        with contextlib.suppress(OSError):
            os.utime(where)  # (recently used: evicted last)
        # the file as this load names it (the same file, another spelling of its path: ../x, a link)
        old, new = table.path, str(path)
        if old != new:
            if table.info.source == old:
                table.info.source = new
            table.notices = [n.replace(old, new) for n in table.notices]
            table.path = new
        return table
    table = load()
    with contextlib.suppress(Exception):  # a cache that cannot be written is no reason to fail a load
        if write(table, where):
            evict(where.parent, max_bytes(), ".table")
    return table


def file_key(path: Path, rank_hint: int | None, flows: bool) -> str:
    digest = blake2b(digest_size=20)
    digest.update(f"{code_key()}|{kept_env()}|{path.resolve()}|{rank_hint}|{flows}|".encode())
    hash_file(digest, path, path.stat())
    return digest.hexdigest()


def write(table: FileTable, where: Path) -> bool:
    """Write `table` to `where` (a temp file, then renamed); False when a column cannot be kept."""
    blobs: list[tuple[int, bytes | memoryview]] = []
    columns: list[_Column] = []
    at = 0

    def place(data: np.ndarray) -> int:
        nonlocal at
        at = -(-at // _ALIGN) * _ALIGN
        start = at
        buffer = np.ascontiguousarray(data)
        blobs.append((start, buffer.data.cast("B")))
        at += buffer.nbytes
        return start

    for name, column in table.columns.items():
        if isinstance(column, SparseColumn):
            if column.values.dtype.kind not in _NUMERIC:
                return False
            rows = place(np.asarray(column.rows, dtype=np.int64))
            values = place(column.values)
            columns.append(
                _Column(name, "sparse", column.values.dtype.str, column.n, rows, values, len(column.rows))
            )
            continue
        if not isinstance(column, np.ndarray) or column.ndim != 1 or column.dtype.kind not in _NUMERIC:
            return False
        value = constant_value(column)
        if value is not None and (column.dtype.kind != "f" or np.isfinite(value)):  # (JSON has no NaN)
            columns.append(_Column(name, "constant", column.dtype.str, len(column), value=value.item()))
        else:
            columns.append(_Column(name, "dense", column.dtype.str, len(column), place(column)))
    header = msgspec.json.encode(
        _Header(table.path, table.names, table.cats, table.info, table.declared_rank, table.notices, columns)
    )
    start = -(-(len(MAGIC) + 8 + len(header)) // _ALIGN) * _ALIGN
    where.parent.mkdir(parents=True, exist_ok=True)
    tmp = where.with_name(f".{where.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(MAGIC + len(header).to_bytes(8, "little") + header)
            for offset, data in blobs:
                fh.seek(start + offset)
                fh.write(data)
            fh.truncate(start + at)
        os.replace(tmp, where)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return True


def read(where: Path) -> FileTable | None:
    """The table kept at `where`; None when there is none, or it does not read back whole (then removed)."""
    try:
        with open(where, "rb") as fh:
            return _read(fh)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, OverflowError, msgspec.DecodeError):
        pass
    with contextlib.suppress(OSError):
        where.unlink()
    return None


def _read(fh: Any) -> FileTable:
    size = os.fstat(fh.fileno()).st_size
    head = fh.read(len(MAGIC) + 8)
    if len(head) < len(MAGIC) + 8 or head[: len(MAGIC)] != MAGIC:
        raise ValueError("not a cached table")
    length = int.from_bytes(head[len(MAGIC) :], "little")
    if length > size:
        raise ValueError("header past the end")
    header = msgspec.json.decode(fh.read(length), type=_Header)
    start = -(-(len(MAGIC) + 8 + length) // _ALIGN) * _ALIGN
    data = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size > start else b""
    n = header.columns[0].n if header.columns else 0

    def view(dtype: np.dtype[Any], offset: int, count: int) -> np.ndarray:
        if offset < 0 or count < 0 or start + offset + count * dtype.itemsize > size:
            raise ValueError("a column past the end")
        return np.frombuffer(data, dtype=dtype, count=count, offset=start + offset)

    columns: dict[str, Any] = {}
    for c in header.columns:
        dtype = np.dtype(c.dtype)
        if dtype.kind not in _NUMERIC or c.n != n:
            raise ValueError("a column that is not one")
        if c.kind == "dense":
            columns[c.name] = view(dtype, c.offset, c.n)
        elif c.kind == "constant":
            columns[c.name] = constant_column(c.value, c.n, dtype)
        elif c.kind == "sparse":
            rows = view(np.dtype(np.int64), c.offset, c.set_rows)
            if len(rows) and (rows.min() < 0 or rows.max() >= c.n):
                raise ValueError("a row past the column's end")
            columns[c.name] = SparseColumn(c.n, rows, view(dtype, c.offset2, c.set_rows))
        else:
            raise ValueError(f"a column of kind {c.kind!r}")
    return FileTable(
        header.path, header.names, header.cats, columns, header.info, header.declared_rank, header.notices
    )
