"""The Device protocol suite of tests/device/test_protocol.py, on cuda:0."""

from __future__ import annotations

import pytest

import vmem
from tests.device import test_protocol as suite


@pytest.fixture
def dev():
    d = vmem.device("cuda:0", memory="32MiB", pinned_memory="8MiB")
    yield d
    d.close()


test_it_is_a_device_with_a_spec_and_a_pool_of_its_capacity = (
    suite.test_it_is_a_device_with_a_spec_and_a_pool_of_its_capacity
)
test_the_pool_allocates_frees_and_refuses_beyond_capacity_unchanged = (
    suite.test_the_pool_allocates_frees_and_refuses_beyond_capacity_unchanged
)
test_streams_record_events_that_complete_after_a_host_wait = (
    suite.test_streams_record_events_that_complete_after_a_host_wait
)
test_link_stats_count_both_directions = suite.test_link_stats_count_both_directions
test_close_is_idempotent_and_leaves_no_thread = suite.test_close_is_idempotent_and_leaves_no_thread
test_data_operations = suite.test_data_operations
test_a_trainer_runs_only_where_data_is_held = suite.test_a_trainer_runs_only_where_data_is_held


def test_the_repr_states_the_reserve_and_the_gpu(dev):
    text = repr(dev)
    assert "reserve" in text and "sm_" in text and dev.spec.kind == "cuda"


def test_the_default_capacity_is_free_memory_less_the_reserve():
    import cupy

    free, _ = cupy.cuda.runtime.memGetInfo()
    with vmem.device("cuda:0", reserve="2GiB") as d:
        assert abs(d.pool.capacity - (free - (2 << 30))) <= 64 << 20
