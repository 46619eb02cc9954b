"""unique_inverse groups integer columns as np.unique(return_inverse=True) does, whatever their range and count."""

from __future__ import annotations

import numpy as np
import pytest

from stepscope.analysis.codes import unique_inverse


def _cases() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [
        np.zeros(0, dtype=np.int32),
        np.array([5], dtype=np.int64),
        rng.integers(0, 300, 5000).astype(np.int32),  # name codes: a small range
        rng.integers(-1, 3, 5000).astype(np.int32),  # -1 for absent
        rng.choice(np.array([2910249, -549452224, 5, 2**40]), 5000),  # thread ids: few, far apart
        rng.integers(-(2**62), 2**62, 5000),  # many, far apart
        rng.integers(0, 200, 5000).astype(np.uint8),
        np.array([2**63 - 1, -(2**63), 0, 2**63 - 1]),
    ]


@pytest.mark.parametrize("values", _cases(), ids=lambda v: f"{v.dtype}-{len(v)}")
def test_unique_inverse_is_what_np_unique_gives(values: np.ndarray) -> None:
    uniq, inverse = unique_inverse(values)
    expected_uniq, expected_inverse = np.unique(values, return_inverse=True)
    assert uniq.dtype == values.dtype
    assert uniq.tolist() == expected_uniq.tolist()
    assert inverse.tolist() == expected_inverse.reshape(-1).tolist()
