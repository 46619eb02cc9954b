"""The small statistics the analysis uses instead of numpy's (which import numpy.ma on first use) agree with
numpy's."""

from __future__ import annotations

import statistics

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from stepscope.analysis.stats import fmean, median, quantile

finite = st.floats(min_value=-1e12, max_value=1e12, allow_nan=False)


@given(st.lists(finite, min_size=1, max_size=50))
def test_median_is_numpys(values: list[float]) -> None:
    assert median(values) == float(np.median(np.array(values)))


@given(st.lists(st.integers(min_value=-(10**12), max_value=10**12), min_size=1, max_size=50))
def test_median_of_ints_is_numpys(values: list[int]) -> None:
    assert median(values) == float(np.median(np.array(values, dtype=np.int64)))


@given(st.lists(finite, min_size=1, max_size=50), st.sampled_from([0.0, 0.1, 0.5, 0.9, 0.99, 1.0]))
def test_quantile_is_numpys(values: list[float], q: float) -> None:
    assert quantile(values, q) == pytest.approx(float(np.quantile(np.array(values), q)), rel=1e-12, abs=1e-6)


def test_nothing_is_an_error() -> None:
    with pytest.raises(ValueError):
        median([])


@given(st.lists(finite, min_size=1, max_size=50))
def test_fmean_is_the_standard_librarys(values: list[float]) -> None:
    assert fmean(iter(values)) == statistics.fmean(values)
