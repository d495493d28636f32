"""Intents of the allocator tests of CuPy (tests/cupy_tests/cuda_tests/test_memory.py), RMM (cpp/tests/mr/)
and PyTorch (memory-statistics consistency in test/test_cuda.py) that vmem's other pool tests do not
already cover: the exact capacity boundary, zero-byte requests, and allocation and free from many threads
at once with the statistics consistent afterwards."""

from __future__ import annotations

import random
import threading

import pytest

from vmem.errors import OutOfDeviceMemory
from vmem.pool import DevicePool


def test_the_whole_capacity_in_one_block_and_not_a_byte_more():
    pool = DevicePool(1 << 20, 256)
    block = pool.allocate(1 << 20)
    assert block.offset == 0 and pool.stats().largest_free == 0
    with pytest.raises(OutOfDeviceMemory):
        pool.allocate(1)
    pool.free(block)
    with pytest.raises(OutOfDeviceMemory):
        pool.allocate((1 << 20) + 1)
    assert pool.in_use == 0 and pool.stats().largest_free == 1 << 20


def test_zero_byte_requests_get_distinct_blocks():
    pool = DevicePool(1 << 16, 256)
    blocks = [pool.allocate(0) for _ in range(8)]
    assert len({b.offset for b in blocks}) == 8 and pool.in_use == 8 * 256
    for b in blocks:
        pool.free(b)
    assert pool.in_use == 0


def test_many_threads_allocating_and_freeing_leave_consistent_statistics():
    pool = DevicePool(64 << 20, 256)
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = random.Random(seed)
        mine = []
        try:
            for _ in range(400):
                if mine and rng.random() < 0.5:
                    pool.free(mine.pop(rng.randrange(len(mine))))
                else:
                    try:
                        mine.append(
                            pool.allocate(
                                rng.randrange(1, 1 << 18), None, rng.choice(["feature_maps", "workspace", "other"])
                            )
                        )
                    except OutOfDeviceMemory:
                        pass
                if rng.random() < 0.05:  # a snapshot in the middle tiles the arena exactly
                    snap = pool.snapshot()
                    assert sum(b["size"] for b in snap["blocks"]) == snap["capacity"]
            for b in mine:
                pool.free(b)
        except BaseException as exc:  # noqa: BLE001 - re-raised by the test
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    stats = pool.stats()
    assert stats.in_use == 0 and stats.count == 0 and stats.free == stats.capacity
    assert all(c.in_use == 0 and c.count == 0 for c in stats.by_category.values())
    assert stats.largest_free == stats.capacity  # everything coalesced back into one block
