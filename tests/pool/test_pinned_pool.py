"""PinnedHostPool: reserved up front, exact sizes, buffers return only after their copy's event."""

from __future__ import annotations

import numpy as np
import pytest

from tests.fakes import FakeStream
from vmem.errors import OutOfDeviceMemory, OutOfPinnedMemory
from vmem.pool import PinnedHostPool

KiB = 1024


def test_capacity_is_reserved_and_prefaulted_up_front():
    pool = PinnedHostPool(64 * KiB)
    assert pool.arena.buffer.nbytes == 64 * KiB
    assert not pool.arena.buffer.any()  # touched (zero-filled) at reservation
    assert pool.stats().in_use == 0


def test_buffer_returns_only_after_its_copy_event_completes():
    s = FakeStream("memory")
    pool = PinnedHostPool(2 * KiB, alignment=1024)
    a = pool.allocate(KiB)
    pool.allocate(KiB)
    copy_done = s.record()
    pool.free(a, copy_done)
    assert pool.stats().in_use == KiB and pool.stats().pending == KiB
    assert pool.snapshot()["blocks"][0]["ready"] is False
    s.advance()
    c = pool.allocate(KiB)  # reclaimed once the event completed, without a host wait
    assert c.offset == a.offset and s.host_waits == 0


def test_exhaustion_waits_for_pending_copies_first_then_raises_its_own_error():
    s = FakeStream("memory")
    pool = PinnedHostPool(2 * KiB, alignment=1024)
    a = pool.allocate(2 * KiB, category="encoded")
    pool.free(a, s.record())
    b = pool.allocate(2 * KiB)  # the host waits for the copy, then reuses the buffer
    assert b.offset == 0 and s.host_waits == 1
    before = pool.stats()
    with pytest.raises(OutOfPinnedMemory, match="Out of pinned host memory") as info:
        pool.allocate(KiB)
    assert not isinstance(info.value, OutOfDeviceMemory)
    assert isinstance(info.value, MemoryError)
    assert "pinned_memory=" in info.value.remedy
    assert pool.stats() == before


def test_exact_sizes_not_powers_of_two():
    pool = PinnedHostPool(3 * 2**20, alignment=256)
    b = pool.allocate(3 * 2**20 - 100)  # CuPy's pinned pool would round this to 4 MiB and fail
    assert b.size == 3 * 2**20
    view = pool.view(b, (1000,), np.float64)
    view[:] = 1.5
    assert view.sum() == 1500


def test_statistics_by_category_of_offloaded_bytes():
    pool = PinnedHostPool(8 * KiB, alignment=256)
    pool.allocate(1000, category="feature_maps")
    pool.allocate(300, category="encoded")
    s = pool.stats()
    assert s.by_category["feature_maps"].in_use == 1024
    assert s.by_category["encoded"].in_use == 512
    assert s.peak == 1536
