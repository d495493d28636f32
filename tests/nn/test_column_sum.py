"""column_sum: the rows' sum that layers use for bias and normalization gradients."""

from __future__ import annotations

import types

import numpy as np
import pytest

from vmem.nn.base import column_sum

#: An array module that is not NumPy (as CuPy is not): column_sum takes its blocked path.
OTHER = types.SimpleNamespace(sum=np.sum)


@pytest.mark.parametrize("rows", [1, 4095, 4096, 64 * 56 * 56, 8191 * 2, 65537])  # 65537 is prime
def test_column_sum_in_blocks_equals_the_sum_of_the_rows(rows):
    a = np.random.default_rng(rows).standard_normal((rows, 3)).astype(np.float64)
    out = np.empty(3)
    got = column_sum(OTHER, a, out=out)
    assert got is out
    np.testing.assert_allclose(out, a.sum(axis=0), rtol=1e-12, atol=1e-9)


def test_column_sum_on_numpy_is_numpys_own_sum_bit_for_bit():
    a = np.random.default_rng(0).standard_normal((10_000, 5)).astype(np.float32)
    assert np.array_equal(column_sum(np, a), a.sum(axis=0))
