"""DevicePool: exact offsets for split/merge/reuse, statistics, errors and stream ordering."""

from __future__ import annotations

import pytest

from tests.fakes import FakeStream, WaitingStream
from vmem.errors import OutOfDeviceMemory
from vmem.pool import CATEGORIES, DevicePool, HostArena, PoolHook

KiB = 1024


def offsets(pool):
    return [(b["offset"], b["size"], b["state"]) for b in pool.snapshot()["blocks"]]


def test_allocations_are_aligned_and_rounded_up():
    pool = DevicePool(64 * KiB, alignment=256)
    a = pool.allocate(1)
    b = pool.allocate(257)
    c = pool.allocate(0)
    assert (a.offset, a.size, a.nbytes) == (0, 256, 1)
    assert (b.offset, b.size, b.nbytes) == (256, 512, 257)
    assert (c.offset, c.size) == (768, 256)
    assert pool.in_use == 1024


def test_best_fit_split_and_coalescing_on_exact_offsets():
    pool = DevicePool(16 * KiB, alignment=1024)
    blocks = [pool.allocate(KiB) for _ in range(6)]
    pool.free(blocks[1])  # hole of 1 KiB at 1 KiB
    pool.free(blocks[3])
    pool.free(blocks[4])  # hole of 2 KiB at 3 KiB (merged)
    assert offsets(pool)[:6] == [
        (0, 1024, "allocated"),
        (1024, 1024, "free"),
        (2048, 1024, "allocated"),
        (3072, 2048, "free"),
        (5120, 1024, "allocated"),
        (6144, 10240, "free"),
    ]
    # best fit: a 2 KiB request takes the 2 KiB hole, not the tail; a 1 KiB request the 1 KiB hole
    assert pool.allocate(2 * KiB).offset == 3072
    assert pool.allocate(KiB).offset == 1024
    # a 512-byte request rounds to 1 KiB and splits the tail at its low end
    assert pool.allocate(512).offset == 6144
    for b in pool.blocks():
        pool.free(b)
    assert offsets(pool) == [(0, 16 * KiB, "free")]


def test_statistics_per_category_and_peak_reset():
    pool = DevicePool(64 * KiB)
    w = pool.allocate(1000, category="weights")
    f1 = pool.allocate(3000, category="feature_maps")
    f2 = pool.allocate(256, category="feature_maps")
    s = pool.stats()
    assert s.in_use == 1024 + 3072 + 256
    assert s.by_category["weights"].in_use == 1024 and s.by_category["weights"].count == 1
    assert s.by_category["feature_maps"].in_use == 3328 and s.by_category["feature_maps"].count == 2
    pool.free(f1)
    s = pool.stats()
    assert s.by_category["feature_maps"].peak == 3328
    assert s.by_category["feature_maps"].in_use == 256
    assert s.peak == 1024 + 3072 + 256
    assert s.free == 64 * KiB - s.in_use
    pool.reset_peak()
    s = pool.stats()
    assert s.peak == s.in_use == 1024 + 256
    assert s.by_category["feature_maps"].peak == 256
    assert (s.allocations, s.frees, s.count) == (3, 1, 2)
    pool.free(w)
    pool.free(f2)
    assert pool.stats().in_use == 0
    assert set(pool.stats().by_category) == set(CATEGORIES)


def test_fragmentation_and_largest_free():
    pool = DevicePool(8 * KiB, alignment=1024)
    blocks = [pool.allocate(KiB) for _ in range(8)]
    for b in blocks[::2]:
        pool.free(b)
    s = pool.stats()
    assert s.free == 4 * KiB and s.largest_free == KiB
    assert s.fragmentation == pytest.approx(0.75)


def test_out_of_memory_states_everything_and_leaves_the_pool_unchanged():
    pool = DevicePool(8 * KiB, alignment=1024)
    blocks = [pool.allocate(KiB, category="weights" if i < 2 else "feature_maps") for i in range(8)]
    for b in blocks[2::2]:
        pool.free(b)
    before_stats, before_snap = pool.stats(), pool.snapshot()
    with pytest.raises(OutOfDeviceMemory) as info:
        pool.allocate(2 * KiB, category="workspace")
    err = info.value
    assert isinstance(err, MemoryError)
    assert (err.requested, err.capacity, err.in_use, err.largest_free) == (2048, 8192, 5120, 1024)
    assert err.fragmentation == pytest.approx(1 - 1024 / 3072)
    assert err.by_category == {"weights": 2048, "feature_maps": 3072}
    assert "fragmentation" in err.remedy
    text = str(err)
    for fact in ("2.00 KiB", "capacity 8.00 KiB", "in use 5.00 KiB", "largest block is 1.00 KiB", "weights"):
        assert fact in text
    assert pool.stats() == before_stats
    assert pool.snapshot() == before_snap
    assert pool.failures == 1
    with pytest.raises(OutOfDeviceMemory, match="exceeds the capacity"):
        pool.allocate(1 << 20)
    assert pool.stats() == before_stats


def test_bad_requests_are_rejected_clearly():
    pool = DevicePool(64 * KiB)
    with pytest.raises(ValueError, match="category='activations'"):
        pool.allocate(10, category="activations")
    with pytest.raises(ValueError, match="negative"):
        pool.allocate(-1)
    with pytest.raises(TypeError, match="integer"):
        pool.allocate(1.5)
    b = pool.allocate(10)
    pool.free(b)
    with pytest.raises(ValueError, match="already freed"):
        pool.free(b)
    with pytest.raises(ValueError, match="power of two"):
        DevicePool(64 * KiB, alignment=300)
    with pytest.raises(ValueError, match="capacity="):
        DevicePool("lots")
    assert pool.stats().in_use == 0


def test_a_stale_handle_never_aliases_a_later_block():
    pool = DevicePool(4 * KiB, alignment=1024)
    a = pool.allocate(KiB)
    pool.free(a)
    b = pool.allocate(KiB)
    assert b is not a and b.offset == a.offset
    with pytest.raises(ValueError, match="already freed"):
        pool.free(a)
    assert pool.stats().count == 1


def test_same_stream_reuses_at_once_other_streams_wait_for_the_event():
    s, t = FakeStream("s"), FakeStream("t")
    pool = DevicePool(3 * KiB, alignment=1024)
    a = pool.allocate(KiB, stream=s)
    pool.free(a, stream=s)  # event pending: s's work may still use it
    assert pool.allocate(KiB, stream=s).offset == 0  # s is ordered after its own free
    b = pool.allocate(KiB, stream=s)
    pool.free(b, stream=s)
    c = pool.allocate(KiB, stream=t)
    assert c.offset != b.offset  # t does not get b's block while the event is pending
    assert s.host_waits == 0
    s.advance()  # the event completes: now t may have it, without a host wait
    d = pool.allocate(KiB, stream=t)
    assert d.offset == b.offset and s.host_waits == 0
    assert pool.stats().free == 0


def test_when_memory_is_short_the_host_waits_on_pending_events():
    s, t = FakeStream("s"), FakeStream("t")
    pool = DevicePool(2 * KiB, alignment=1024)
    a = pool.allocate(2 * KiB, stream=s)
    pool.free(a, stream=s)
    snap = pool.snapshot()["blocks"]
    assert snap == [
        {"offset": 0, "size": 2048, "state": "free", "category": None, "stream": "s", "requested": 0, "ready": False}
    ]
    assert pool.stats().pending == 2 * KiB
    b = pool.allocate(2 * KiB, stream=t)  # only possible after waiting on s's event
    assert b.offset == 0 and s.host_waits == 1
    assert pool.stats().pending == 0


def test_free_defaults_to_the_allocation_stream_and_host_frees_are_immediate():
    s, t = FakeStream("s"), FakeStream("t")
    pool = DevicePool(2 * KiB, alignment=1024)
    a = pool.allocate(KiB, stream=s)
    pool.free(a)  # on s, by default
    assert pool.snapshot()["blocks"][0]["stream"] == "s"
    h = pool.allocate(KiB)  # host allocation: takes the other block, s's is not ready
    assert h.offset == KiB
    pool.free(h)
    assert pool.allocate(KiB, stream=t).offset == KiB


def test_reclaim_with_wait_coalesces_everything():
    streams = [FakeStream(f"s{i}") for i in range(3)]
    pool = DevicePool(16 * KiB, alignment=1024)
    blocks = [pool.allocate(KiB, stream=streams[i % 3]) for i in range(16)]
    for b in blocks:
        pool.free(b)
    assert len(pool.snapshot()["blocks"]) == 16  # different owners do not merge
    assert pool.reclaim(wait=True) == 16 * KiB
    assert offsets(pool) == [(0, 16 * KiB, "free")]


def test_hooks_see_allocations_frees_and_failures():
    events = []

    class Recorder(PoolHook):
        def on_allocate(self, block):
            events.append(("alloc", block.offset))

        def on_free(self, block, stream):
            events.append(("free", block.offset, stream))

        def on_failure(self, nbytes, category, error):
            events.append(("fail", nbytes, category))

    pool = DevicePool(2 * KiB, alignment=1024)
    hook = Recorder()
    pool.add_hook(hook)
    b = pool.allocate(10)
    pool.free(b)
    with pytest.raises(OutOfDeviceMemory):
        pool.allocate(4 * KiB, category="workspace")
    pool.remove_hook(hook)
    pool.allocate(10)
    assert events == [("alloc", 0), ("free", 0, None), ("fail", 4 * KiB, "workspace")]


def test_views_over_the_arena():
    import numpy as np

    pool = DevicePool(8 * KiB, upstream=HostArena)
    b = pool.allocate(400)
    v = pool.view(b, (100,), np.float32)
    v[:] = 7
    assert pool.arena.buffer[:4].view(np.float32)[0] == 7
    with pytest.raises(ValueError, match="needs 800 bytes"):
        pool.view(b, (200,), np.float32)
    with pytest.raises(RuntimeError, match="no backing memory"):
        DevicePool(8 * KiB).view(DevicePool(8 * KiB).allocate(1), (1,), np.uint8)


def test_high_placement_takes_the_top_of_the_best_fit():
    pool = DevicePool(8 * KiB, alignment=1024)
    low = pool.allocate(KiB)
    high = pool.allocate(KiB, high=True)
    assert (low.offset, high.offset) == (0, 7 * KiB)
    pool.free(low)
    pool.free(high)
    assert offsets(pool) == [(0, 8 * KiB, "free")]


def test_a_stream_grows_its_blocks_into_free_neighbours_without_waiting():
    s = FakeStream("s")
    pool = DevicePool(4 * KiB, alignment=1024)
    a = pool.allocate(2 * KiB, stream=s)
    b = pool.allocate(KiB)
    pool.free(a, stream=s)  # s owns [0, 2K) until its event completes
    pool.free(b)  # [2K, 4K) free for everyone, but a different owner: not merged
    assert len(pool.snapshot()["blocks"]) == 2
    c = pool.allocate(3 * KiB, stream=s)  # s may use both: absorbed, no wait
    assert c.offset == 0 and s.host_waits == 0


def test_a_planned_place_spans_the_streams_own_frees_and_everyones_without_waiting():
    s = FakeStream("s")
    pool = DevicePool(4 * KiB, alignment=1024)
    a, b, keep = pool.allocate(KiB, stream=s), pool.allocate(2 * KiB), pool.allocate(KiB)
    pool.free(a, stream=s)  # [0, 1K) is s's until its event completes
    pool.free(b)  # [1K, 3K) is everyone's
    c = pool.allocate(2 * KiB, stream=s, offset=512 * 2)  # inside everyone's part
    assert c.offset == KiB
    pool.free(c)
    d = pool.allocate(3 * KiB, stream=s, offset=0)  # across s's own part and everyone's
    assert (d.offset, d.size) == (0, 3 * KiB) and s.host_waits == 0
    pool.free(d)
    pool.free(keep)
    pool.reclaim(wait=True)
    assert offsets(pool) == [(0, 4 * KiB, "free")]


def test_a_planned_place_taken_by_a_stream_waits_there_for_the_frees_it_covers():
    s, mem = WaitingStream("compute"), FakeStream("memory")
    pool = DevicePool(4 * KiB, alignment=1024)
    blocks = [pool.allocate(KiB, stream=s, offset=i * KiB) for i in range(4)]
    for b in blocks[::2]:  # freed on the memory stream (after a copy): pending, in stream order
        pool.free(b, stream=mem)
    c = pool.allocate(KiB, stream=s, offset=0)  # needs only the first free's event, not the second's
    # the stream waits for it (its later work runs after the copy); the host does not, nothing completes
    assert c.offset == 0 and mem.host_waits == 0 and mem.completed == 0
    assert [(e.stream, e.seq) for e in s.waits] == [(mem, 1)]
    free = [b for b in pool.snapshot()["blocks"] if b["state"] == "free"]
    assert [(b["offset"], b["stream"], b["ready"]) for b in free] == [(2 * KiB, "memory", False)]


def test_a_planned_place_for_the_host_waits_on_the_host_for_the_frees_it_covers():
    s, mem = FakeStream("compute"), FakeStream("memory")
    pool = DevicePool(4 * KiB, alignment=1024)
    blocks = [pool.allocate(KiB, stream=s, offset=i * KiB) for i in range(4)]
    for b in blocks[::2]:
        pool.free(b, stream=mem)
    c = pool.allocate(KiB, stream=None, offset=0)
    assert c.offset == 0 and mem.host_waits == 1 and mem.completed == 1
    free = [b for b in pool.snapshot()["blocks"] if b["state"] == "free"]
    assert [(b["offset"], b["stream"], b["ready"]) for b in free] == [(2 * KiB, "memory", False)]


def test_work_a_hook_enqueues_at_a_free_is_ordered_before_the_free_event():
    s = FakeStream("s")

    class Enqueue(PoolHook):
        def on_free(self, block, stream):
            stream.launch(lambda: None)  # e.g. poisoning the block

    pool = DevicePool(4 * KiB, alignment=1024)
    pool.add_hook(Enqueue())
    block = pool.allocate(KiB, stream=s)
    pool.free(block, stream=s)
    s.advance(1)  # the hook's work has run, nothing after it: the free's event must still be pending
    assert pool.snapshot()["blocks"][0]["ready"] is False
    s.advance()
    assert pool.snapshot()["blocks"][0]["ready"] is True


def test_a_planned_place_over_merged_frees_waits_for_the_later_one():
    """Two frees side by side on one stream merge into one segment gated by the later event: waiting for it
    orders the taker after both (the stream ran them in order)."""
    s, other = WaitingStream("s0"), FakeStream("s1")
    pool = DevicePool(4 * KiB, alignment=1024)
    a, b = pool.allocate(KiB, stream=other, offset=KiB), pool.allocate(KiB, stream=other, offset=2 * KiB)
    pool.free(a, stream=other)
    pool.free(b, stream=other)
    c = pool.allocate(KiB, stream=s, offset=KiB)
    assert c.offset == KiB and [(e.stream, e.seq) for e in s.waits] == [(other, 2)] and other.host_waits == 0
