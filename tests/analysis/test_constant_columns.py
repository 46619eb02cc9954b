"""Columns that hold one value over a whole table are kept as that value (no memory per row) and read like
any other column (#34 item 14)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stepscope.analysis.read._stream import load_file
from stepscope.analysis.read.loader import load_trace, merge_tables
from stepscope.analysis.read.table import concatenate_columns, constant_column, constant_value

from ..support.traces import cpu, kernel, runtime, step, write_trace


def _resident(column: np.ndarray) -> int:
    """Bytes a column holds (a view of one value holds one)."""
    return 0 if constant_value(column) is not None else int(column.nbytes)


def test_a_cpu_only_trace_keeps_its_one_value_columns_without_rows(tmp_path: Path) -> None:
    events = [step(1, 0, 100), *(cpu(f"op{i}", 1 + i, 0.5) for i in range(50)), step(2, 100, 100)]
    table = load_trace(write_trace(tmp_path / "t.json", events, rank=3))
    n = len(table)
    assert n == 52
    for key, value in (
        ("rank", 3),
        ("pid", 100),
        ("tid", 1),
        ("stream", -1),
        ("device", -1),
        ("correlation", -1),
    ):
        column = table.columns[key]
        assert constant_value(column) == value and _resident(column) == 0, key
        assert column.dtype == np.dtype(column.dtype) and column.tolist() == [value] * n
    assert _resident(table.columns["ts"]) == 8 * n and _resident(table.columns["name"]) == 4 * n
    # it reads like a column: masks, indices, comparisons; a selection stays constant; writing raises
    mask = table.columns["ts"] > table.columns["ts"][10]
    part = table.select(mask)
    assert (
        len(part) == int(mask.sum())
        and constant_value(part.columns["pid"]) == 100
        and len(part.columns["pid"]) == len(part)
    )
    assert table.columns["pid"][[0, 5]].tolist() == [100, 100] and bool((table.columns["rank"] == 3).all())
    with pytest.raises(ValueError):
        table.columns["pid"][0] = 7


@pytest.mark.parametrize("chunk_bytes", [1, 1 << 20])
def test_a_column_that_changes_is_kept_whole(tmp_path: Path, chunk_bytes: int) -> None:
    # a second thread and GPU work after events of one value: in a later chunk (one event a chunk) or in the
    # same one
    events = [
        step(1, 0, 100),
        cpu("a", 1, 1),
        cpu("b", 2, 1, tid=2),
        runtime("cudaLaunchKernel", 3, 1, 5),
        kernel("k", 4, 2, stream=7, corr=5),
    ]
    path = write_trace(tmp_path / "t.json", events, rank=0)
    table = merge_tables([load_file(path, chunk_bytes=chunk_bytes)])
    assert table.columns["tid"].tolist() == [1, 1, 2, 1, 7] and _resident(table.columns["tid"]) == 8 * len(
        table
    )
    assert table.columns["correlation"].tolist() == [-1, -1, -1, 5, 5]
    assert table.columns["stream"].tolist() == [-1, -1, -1, -1, 7]
    assert constant_value(table.columns["pid"]) is None and constant_value(table.columns["rank"]) == 0


def test_constant_columns_join_as_one_value_or_as_rows() -> None:
    a, b = constant_column(4, 3, np.int32), constant_column(4, 2, np.int32)
    joined = concatenate_columns([a, b])
    assert constant_value(joined) == 4 and len(joined) == 5 and joined.dtype == np.int32
    mixed = concatenate_columns([a, constant_column(5, 2, np.int32)])
    assert constant_value(mixed) is None and mixed.tolist() == [4, 4, 4, 5, 5]
