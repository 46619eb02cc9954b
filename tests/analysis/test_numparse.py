"""Exact us -> ns conversion of JSON number texts (the `ts` of epoch timestamps with a ns fraction): the
vectorised paths must give what decimal arithmetic gives, text by text."""

from __future__ import annotations

from decimal import Decimal

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepscope.analysis.read._numparse import NotANumber, us_texts_to_ns
from stepscope.analysis.read.table import decimal_us_to_ns


def expected(text: str) -> int:
    return 0 if text == "null" else decimal_us_to_ns(Decimal(text))


def raw(texts: list[str]) -> list[msgspec.Raw]:
    return [msgspec.Raw(t.encode()) for t in texts]


# epoch microseconds with a ns fraction: a shared leading part and varying trailing digits, as in one trace
epoch = st.builds(
    lambda head, tail, frac: f"{head}{tail:06d}.{frac:03d}",
    st.sampled_from(["1712195495", "1623212388", "9999999999"]),
    st.integers(0, 999_999),
    st.integers(0, 999),
)
number = st.one_of(
    epoch,
    st.integers(-(10**17), 10**17).map(str),
    st.decimals(allow_nan=False, allow_infinity=False, places=3, min_value=-(10**15), max_value=10**15).map(
        str
    ),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),  # exponents, long fractions
    st.just("null"),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(epoch, min_size=1, max_size=50))
def test_epoch_timestamps_of_one_width(texts: list[str]) -> None:
    assert us_texts_to_ns(raw(texts)).tolist() == [expected(t) for t in texts]


@settings(max_examples=300, deadline=None)
@given(st.lists(number, min_size=1, max_size=50))
def test_any_numbers(texts: list[str]) -> None:
    assert us_texts_to_ns(raw(texts)).tolist() == [expected(t) for t in texts]


@pytest.mark.parametrize(
    "texts",
    [
        ["1712195495519689.047", "1712195495519689.048"],  # every column but the last the same
        ["1712195495519689.047"] * 3,  # every column the same
        ["1712195495519689.047", "1712195495519689e03"],  # same width, another shape: general path
        ["9223372036854775.807", "9223372036854775.808"],  # the second is beyond int64 ns: 0
        ["0000000000000001.000", "0000000000000002.500"],
    ],
)
def test_same_width_edge_cases(texts: list[str]) -> None:
    assert us_texts_to_ns(raw(texts)).tolist() == [expected(t) for t in texts]


def test_a_string_is_not_a_number() -> None:
    with pytest.raises(NotANumber) as info:
        us_texts_to_ns(raw(["1712195495519689.047", '"1712195495519.047"']))
    assert info.value.index == 1
