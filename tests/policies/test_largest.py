"""The largest-batch search every caller shares (vmem.largest_batch, the Trainer's batch advice, the GPU
bench): the largest value that fits, with as few tries as doubling and bisection take."""

from __future__ import annotations

import pytest

from vmem.policies.budget import largest_fitting


@pytest.mark.parametrize("limit", [0, 1, 2, 3, 7, 64, 100, 4095, 5000])
@pytest.mark.parametrize("most", [1, 5, 4095])
def test_the_largest_value_that_fits(limit, most):
    tried = []

    def fits(n):
        tried.append(n)
        return n <= limit

    assert largest_fitting(fits, most) == min(limit, most)
    assert len(tried) <= 2 * most.bit_length() + 1
    if limit < most:  # a value known not to fit: bisected at once, never tried again
        tried.clear()
        assert largest_fitting(fits, most, unfit=limit + 1) == limit
        assert limit + 1 not in tried


def test_nothing_to_search():
    assert largest_fitting(lambda n: True, 0) == 0
    assert largest_fitting(lambda n: False, 10) == 0
