"""SparseColumn (the args of collectives, bytes of memory activities) reads like the numpy column it stands for."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from stepscope.analysis.read.table import MISSING, SparseColumn, concatenate_columns


def _dense(seed: int, n: int = 500) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.full(n, MISSING, dtype=np.int64)
    at = rng.choice(n, size=int(rng.integers(0, n // 10 + 1)), replace=False)
    out[at] = rng.integers(0, 2**40, len(at))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_indexing_and_comparing_give_what_the_dense_column_gives(seed: int) -> None:
    dense = _dense(seed)
    col = SparseColumn.of(dense)
    rng = np.random.default_rng(100 + seed)
    assert len(col) == len(dense) and col.shape == dense.shape and col.dtype == dense.dtype
    assert np.array_equal(np.asarray(col), dense) and col.tolist() == dense.tolist()
    for row in [0, len(dense) - 1, -1, -len(dense), *rng.integers(0, len(dense), 20).tolist()]:
        assert col[row] == dense[row]
    rows = rng.integers(-len(dense), len(dense), 300)
    assert col[rows].tolist() == dense[rows].tolist()
    mask = rng.random(len(dense)) < 0.4
    assert np.array_equal(np.asarray(col[mask]), dense[mask])
    assert isinstance(col[mask], SparseColumn)
    for a, b in ((0, 500), (17, 230), (300, 100), (-50, None)):
        assert np.array_equal(np.asarray(col[a:b]), dense[a:b])
    assert np.array_equal(np.asarray(col[::3]), dense[::3])
    assert np.array_equal(col == MISSING, dense == MISSING)
    assert np.array_equal(col != MISSING, dense != MISSING)
    assert np.array_equal(col >= 2**39, dense >= 2**39)
    names = np.arange(2**20, dtype=np.int64) * 3  # indexing an array by it, as tests decode codes
    small = SparseColumn.of(np.where(dense >= 0, dense % 2**20, MISSING))
    assert np.array_equal(names[small], names[np.asarray(small)])
    again = pickle.loads(pickle.dumps(col))
    assert np.array_equal(np.asarray(again), dense)


def test_out_of_bounds_rows_raise_as_numpy_does() -> None:
    col = SparseColumn.of(_dense(1, 10))
    with pytest.raises(IndexError):
        col[10]
    with pytest.raises(IndexError):
        col[np.array([3, 10])]


def test_concatenation_map_and_astype() -> None:
    a, b = _dense(2), _dense(3, 77)
    joined = concatenate_columns([SparseColumn.of(a), b, SparseColumn.of(a[:0])])
    assert isinstance(joined, SparseColumn)
    assert np.array_equal(np.asarray(joined), np.concatenate([a, b]))
    codes = SparseColumn.of(np.array([-1, 2, -1, 0, 1], dtype=np.int32))
    lookup = np.array([5, 6, 7], dtype=np.int32)
    assert codes.map(lookup).tolist() == [-1, 7, -1, 5, 6]
    assert codes.astype(np.int64).dtype == np.int64 and codes.astype(np.int32, copy=False) is codes
    # rows given out of order are put in order
    unordered = SparseColumn(6, np.array([4, 1]), np.array([40, 10]))
    assert unordered.tolist() == [-1, 10, -1, -1, 40, -1]
