"""Column sums, the rows' sum that layers use for bias and normalization gradients (``ctx.ops``)."""

from __future__ import annotations

import numpy as np
import pytest

from vmem.nn.ops import ArrayOps, HostOps


@pytest.mark.parametrize("rows", [1, 4095, 4096, 64 * 56 * 56, 8191 * 2, 65537])  # 65537 is prime
def test_column_sum_in_blocks_equals_the_sum_of_the_rows(rows):
    """ArrayOps (a GPU's) sums blocks of rows first; on NumPy arrays the result is the same sum."""
    a = np.random.default_rng(rows).standard_normal((rows, 3)).astype(np.float64)
    out = np.empty(3)
    got = ArrayOps(np).column_sum(a, out=out)
    assert got is out
    np.testing.assert_allclose(out, a.sum(axis=0), rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("ops", [HostOps(), ArrayOps(np)], ids=["host", "array"])
def test_float32_columns_are_summed_in_float64_and_rounded_once(ops):
    """float32 rows are accumulated in float64: the sum is the float64 sum rounded once, where float32
    accumulation (NumPy's over axis 0 adds the rows one after another) loses digits as the rows grow."""
    a = (np.random.default_rng(0).standard_normal((200_000, 5)) + 100).astype(np.float32)
    exact = a.astype(np.float64).sum(axis=0)
    got = ops.column_sum(a)
    assert got.dtype == np.float32
    assert np.array_equal(got, np.sum(a, axis=0, dtype=np.float64).astype(np.float32))
    out = np.empty(5, np.float32)
    assert ops.column_sum(a, out=out) is out and np.array_equal(out, got)
    assert np.max(np.abs(got - exact) / exact) < 1e-7  # one rounding
    assert np.max(np.abs(a.sum(axis=0) - exact) / exact) > 1e-6  # float32 accumulation


def test_batch_norm_statistics_are_the_float64_ones_rounded():
    """Batch norm computes its statistics through ``ops.column_sum``: within a rounding or two of the float64
    mean and variance."""
    x = np.random.default_rng(1).standard_normal((3000, 7)).astype(np.float32) * 3 + 1
    ops, m = HostOps(), x.shape[0]
    mean = np.empty(7, np.float32)
    ops.column_sum(x, out=mean)
    mean /= m
    centred = x - mean
    centred *= centred
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(mean, x64.mean(axis=0), rtol=3e-7, atol=1e-7)
    np.testing.assert_allclose(ops.column_sum(centred) / m, x64.var(axis=0), rtol=1e-6)
