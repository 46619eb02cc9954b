"""Many files' tables as one: each file given a distinct rank (`assign_ranks`), the ranks of a merged trace
split apart (`split_merged`), and their columns joined under one symbol table (`merge_tables`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from stepscope.analysis.read._stream import FileTable
from stepscope.analysis.read.table import (
    COLUMNS,
    INT64_ARGS,
    MISSING,
    STRING_ARGS,
    RankInfo,
    SparseColumn,
    TraceTable,
    concatenate_columns,
    constant_column,
    constant_value,
)

__all__ = ["assign_ranks", "merge_tables", "split_merged"]


def assign_ranks(tables: list[FileTable]) -> list[str]:
    """Give every file a distinct rank: declared ones first (path order), then the lowest free ranks. The notes
    name the first RANK_NOTES files of each kind, then count the rest."""
    taken: dict[int, str] = {}
    pending: list[FileTable] = []
    for t in sorted(tables, key=lambda t: t.path):
        r = t.declared_rank
        if r is not None and r not in taken:
            t.info.rank = r
            taken[r] = t.path
        else:
            pending.append(t)
    free = 0
    notes: list[tuple[str, str]] = []  # (kind, text), in path order
    for t in pending:
        while free in taken:
            free += 1
        t.info.rank = free
        t.info.rank_assigned = True
        taken[free] = t.path
        if t.declared_rank is not None:
            other = taken[t.declared_rank]
            text = f"{t.path}: declares rank {t.declared_rank} like {other}; loaded as rank {free}"
            notes.append((_TAKEN, text))
        elif len(tables) > 1:
            notes.append((_NONE, f"{t.path}: no distributedInfo.rank; loaded as rank {free}"))
    return _first_of_each(notes)


RANK_NOTES = 10  # files named per kind of rank note; the rest are counted
_TAKEN = "files declare a rank another file declares; each loaded as the lowest free rank"
_NONE = "files have no distributedInfo.rank; each loaded as the lowest free rank"


def _first_of_each(notes: list[tuple[str, str]]) -> list[str]:
    """The first RANK_NOTES notes of each kind, in order, then a count of each kind's rest."""
    out: list[str] = []
    seen: dict[str, int] = {}
    for kind, text in notes:
        seen[kind] = seen.get(kind, 0) + 1
        if seen[kind] <= RANK_NOTES:
            out.append(text)
    out += [f"{n - RANK_NOTES:,} more {kind}" for kind, n in seen.items() if n > RANK_NOTES]
    return out


def split_merged(tables: list[FileTable]) -> list[FileTable]:
    """A trace written by `stepscope merge` holds one process per rank: each becomes a table of its own."""
    out = []
    for t in tables:
        ranks = _merged_pids(t.info.merge_header)
        if ranks is None:
            out.append(t)
            continue
        pid = t.columns["pid"]
        for p, (rank, world, backend) in sorted(ranks.items(), key=lambda item: item[1][0]):
            mask = pid == p
            info = RankInfo(rank=rank, source=f"{t.path} (rank {rank})", world_size=world, backend=backend)
            info.merge_header = t.info.merge_header
            columns = {key: column[mask] for key, column in t.columns.items()}
            out.append(FileTable(t.path, t.names, t.cats, columns, info, rank, list(t.notices)))
    return out


def _merged_pids(header: Any) -> dict[int, tuple[int, int | None, str | None]] | None:
    """pid -> (rank, world size, backend) from a merged trace's `stepscopeMerge`; None for other traces."""
    if not isinstance(header, dict) or header.get("schema") != "stepscope.merge/1":
        return None
    out = {}
    for entry in header.get("ranks") or []:
        rank = entry.get("rank") if isinstance(entry, dict) else None
        pid = entry.get("pid") if isinstance(entry, dict) else None
        if type(rank) is int and type(pid) is int and 0 <= rank < 2**31 and pid not in out:
            world, backend = entry.get("world_size"), entry.get("backend")
            out[pid] = (
                rank,
                world if type(world) is int else None,
                backend if isinstance(backend, str) else None,
            )
    return out or None


def merge_tables(tables: list[FileTable]) -> TraceTable:
    tables = split_merged(tables)
    notices = assign_ranks(tables)
    tables = sorted(tables, key=lambda t: t.info.rank)
    names: dict[str, int] = {}
    cats: dict[str, int] = {}
    parts: dict[str, list[np.ndarray]] = {}
    for t in tables:
        first = not names and not cats  # the first file's codes stay as they are
        name_map = np.array([names.setdefault(n, len(names)) for n in t.names] + [MISSING], dtype=np.int32)
        cat_map = np.array([cats.setdefault(c, len(cats)) for c in t.cats] + [MISSING], dtype=np.int32)
        n = len(t.columns["ts"])
        columns = dict(t.columns)
        columns["rank"] = constant_column(t.info.rank, n, np.int32)
        if not first:
            columns["cat"] = _recoded(columns["cat"], cat_map)
            for key in ("name", *(f"args_{k}" for k in STRING_ARGS)):
                columns[key] = _recoded(columns[key], name_map)
        for key, column in columns.items():
            parts.setdefault(key, []).append(column)
        notices.extend(t.notices)
    dtypes = {
        **{c: d for c, (d, _) in COLUMNS.items()},
        **{f"args_{k}": "int32" for k in STRING_ARGS},  # codes into `names`
        **{f"args_{k}": "int64" for k in INT64_ARGS},
    }
    merged = {key: _join(parts.pop(key, []), dtype) for key, dtype in dtypes.items()}
    ranks = {t.info.rank: t.info for t in tables}
    return TraceTable(list(names), list(cats), merged, ranks, notices)


def _recoded(column: Any, lookup: np.ndarray) -> Any:
    """lookup[column]: a file's symbol codes as the merged table's (sparse and constant columns kept so)."""
    if isinstance(column, SparseColumn):
        return column.map(lookup)
    value = constant_value(column)
    if value is not None:
        return constant_column(lookup[value], len(column), lookup.dtype)
    return lookup[column]


def _join(parts: list[Any], dtype: str) -> Any:
    """One column from the files' parts (a single file's column is used as it is, not copied)."""
    column = parts[0] if len(parts) == 1 else concatenate_columns(parts) if parts else np.zeros(0)
    return column.astype(dtype, copy=False)
