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


def test_column_sum_on_the_host_is_numpys_own_sum_bit_for_bit():
    a = np.random.default_rng(0).standard_normal((10_000, 5)).astype(np.float32)
    assert np.array_equal(HostOps().column_sum(a), a.sum(axis=0))


def test_batch_norm_statistics_are_numpys_mean_and_variance_bit_for_bit():
    """Batch norm computes its statistics through ``ops.column_sum`` as NumPy's mean and var do."""
    x = np.random.default_rng(1).standard_normal((3000, 7)).astype(np.float32) * 3 + 1
    ops, m = HostOps(), x.shape[0]
    mean = np.empty(7, np.float32)
    ops.column_sum(x, out=mean)
    mean /= m
    centred = x - mean
    centred *= centred
    assert np.array_equal(mean, x.mean(axis=0)) and np.array_equal(ops.column_sum(centred) / m, x.var(axis=0))
