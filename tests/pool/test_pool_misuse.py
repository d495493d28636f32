"""Misuse of the pools is refused before anything changes; what is legal but unusual works."""

from __future__ import annotations

import numpy as np
import pytest

from tests.fakes import FakeStream
from vmem.pool import DevicePool, HostArena, PinnedHostPool
from vmem.streams import CpuStream


def test_a_block_of_another_pool_is_refused_and_both_pools_are_unchanged():
    a, b = DevicePool(1 << 20), DevicePool(1 << 20)
    block = a.allocate(4096)
    b.allocate(8192)
    before = (a.snapshot(), b.snapshot(), a.stats(), b.stats())
    with pytest.raises(ValueError, match="not a block of this pool"):
        b.free(block)
    assert (a.snapshot(), b.snapshot(), a.stats(), b.stats()) == before
    a.free(block)
    assert a.in_use == 0


def test_a_stale_handle_is_refused_and_the_pool_is_unchanged():
    pool = DevicePool(1 << 20)
    block = pool.allocate(4096)
    pool.free(block)
    again = pool.allocate(4096)  # the same place, a new handle
    before = pool.snapshot()
    with pytest.raises(ValueError, match="already freed"):
        pool.free(block)
    assert pool.snapshot() == before
    pool.free(again)


def test_a_block_freed_after_its_stream_closed_is_free_at_once():
    pool = DevicePool(1 << 20)
    s = CpuStream("s")
    block = pool.allocate(1 << 19, s)
    s.close()
    pool.free(block)  # its stream finished all its work when it closed
    assert pool.in_use == 0
    t = FakeStream("t")
    again = pool.allocate(1 << 20, t)  # another stream can take all of it, with no wait
    assert again.offset == 0 and t.host_waits == 0


@pytest.mark.parametrize("alignment", [256, 512, 4096])
def test_the_arena_base_is_aligned_so_the_arrays_are(alignment):
    pool = DevicePool(1 << 20, alignment, HostArena)
    for n in (1, 300, 5000):
        view = pool.view(pool.allocate(n), (n,), np.uint8)
        assert view.__array_interface__["data"][0] % alignment == 0


def test_the_pinned_pools_statistics_and_snapshot_agree_once_events_complete():
    pool = PinnedHostPool(1 << 20, prefault=False)
    s = FakeStream("copy")
    block = pool.allocate(4096)
    pool.free(block, s.record())
    assert pool.stats().pending == 4096  # its copy has not finished
    s.advance()
    stats, snap = pool.stats(), pool.snapshot()
    assert stats.pending == 0 and stats.in_use == 0
    assert all(b["state"] == "free" and b["ready"] for b in snap["blocks"])
