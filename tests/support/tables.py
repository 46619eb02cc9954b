"""Helpers for comparing tables built two ways (symbol tables may be in different orders)."""

from __future__ import annotations

import numpy as np

from stepscope.analysis.read.table import STRING_ARGS, TraceTable


def decoded(table: TraceTable) -> dict[str, np.ndarray]:
    """Every column, with name / category / string-arg codes replaced by the strings they stand for."""
    names = np.array([*table.names, "<none>"], dtype=object)
    cats = np.array([*table.cats, "<none>"], dtype=object)
    out = dict(table.columns)
    out["name"] = names[table.columns["name"]]
    out["cat"] = cats[table.columns["cat"]]
    for key in STRING_ARGS:
        out["args_" + key] = names[table.columns["args_" + key]]
    return out


def assert_same_table(a: TraceTable, b: TraceTable) -> None:
    da, db = decoded(a), decoded(b)
    assert sorted(da) == sorted(db)
    for key in da:
        assert da[key].dtype == db[key].dtype, key
        if not np.array_equal(da[key], db[key]):
            bad = np.flatnonzero(da[key] != db[key])[:5]
            raise AssertionError(
                f"column {key} differs at rows {bad.tolist()}: {da[key][bad]} vs {db[key][bad]}"
            )
    assert sorted(a.ranks) == sorted(b.ranks)
