"""Random allocate/free sequences over several streams, checked against the pool's invariants."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tests.fakes import FakeEvent, WaitingStream
from vmem.errors import OutOfDeviceMemory
from vmem.pool import CATEGORIES, DevicePool

CAPACITY = 1 << 16
sizes = st.one_of(st.integers(0, 3000), st.integers(0, CAPACITY // 4), st.sampled_from([256, 512, 1024, 4096]))


class PoolMachine(RuleBasedStateMachine):
    @initialize(alignment=st.sampled_from([1, 64, 256, 512]))
    def make(self, alignment):
        self.pool = DevicePool(CAPACITY, alignment=alignment)
        self.streams = [WaitingStream(f"s{i}") for i in range(3)]
        self.live = []  # handles we own
        # regions freed on a stream and not yet handed out again: [lo, hi, stream, event]
        self.freed = []
        self.expected_peak = 0

    # -- actions -------------------------------------------------------------------------------
    @rule(
        nbytes=sizes,
        stream=st.integers(-1, 2),
        category=st.sampled_from(CATEGORIES),
        high=st.booleans(),
        at=st.one_of(st.none(), st.integers(0, CAPACITY - 1)),
    )
    def allocate(self, nbytes, stream, category, high, at):
        s = None if stream < 0 else self.streams[stream]
        before = self.pool.snapshot()
        try:
            offset = None if at is None else at - at % self.pool.alignment  # a planned place (or best fit)
            block = self.pool.allocate(nbytes, stream=s, category=category, high=high, offset=offset)
        except OutOfDeviceMemory as err:
            assert err.requested > err.largest_free
            assert self.pool.snapshot()["capacity"] == before["capacity"]
            assert sum(b["size"] for b in self.pool.snapshot()["blocks"] if b["state"] == "allocated") == sum(
                b["size"] for b in before["blocks"] if b["state"] == "allocated"
            )
            return
        assert block.size >= max(nbytes, 1) and block.size % self.pool.alignment == 0
        assert block.offset % self.pool.alignment == 0
        # never handed to another stream before the event recorded at its free completed, unless that stream
        # was made to wait for it (a planned place: stream-ordered)
        for region in list(self.freed):
            lo, hi, owner, event = region
            if lo < block.end and block.offset < hi:
                if owner is not s and not event.query():
                    waited = s is not None and offset is not None and any(_covers(w, event) for w in s.waits)
                    assert waited, f"block {block!r} handed to {s and s.name} before {owner.name}'s event"
                self.freed.remove(region)
                if lo < block.offset:
                    self.freed.append([lo, block.offset, owner, event])
                if block.end < hi:
                    self.freed.append([block.end, hi, owner, event])
        self.live.append(block)
        self.expected_peak = max(self.expected_peak, self.pool.in_use)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), where=st.sampled_from(["own", "other", "host"]))
    def free(self, data, where):
        block = self.live.pop(data.draw(st.integers(0, len(self.live) - 1)))
        if where == "own" or (where == "other" and block.stream is None):
            stream = block.stream
        elif where == "other":
            stream = data.draw(st.sampled_from(self.streams))
        else:
            stream = None
        if where == "host":
            block.stream = None  # a host-ordered free: the caller promises no stream uses it
        self.pool.free(block, stream=stream)
        if stream is not None:
            self.freed.append([block.offset, block.end, stream, _event_at_free(stream)])

    @rule(stream=st.integers(0, 2), k=st.integers(0, 4))
    def progress(self, stream, k):
        self.streams[stream].advance(k)

    @rule()
    def reclaim(self):
        self.pool.reclaim()

    @rule(stream=st.integers(0, 2))
    def absorb(self, stream):
        with self.pool._lock:  # the allocator's step 3, on its own: safe for the stream's ordering rule
            self.pool._fit.absorb(self.streams[stream])

    @rule()
    def reset_peak(self):
        self.pool.reset_peak()
        self.expected_peak = self.pool.in_use

    # -- invariants ----------------------------------------------------------------------------
    @invariant()
    def blocks_tile_the_arena_without_overlap(self):
        if not hasattr(self, "pool"):
            return
        expected = 0
        for b in self.pool.snapshot()["blocks"]:
            assert b["offset"] == expected and b["size"] > 0
            assert b["offset"] % self.pool.alignment == 0
            expected += b["size"]
        assert expected == self.pool.capacity

    @invariant()
    def statistics_equal_a_recount(self):
        if not hasattr(self, "pool"):
            return
        snap = self.pool.snapshot()["blocks"]
        stats = self.pool.stats()
        allocated = [b for b in snap if b["state"] == "allocated"]
        assert stats.in_use == sum(b["size"] for b in allocated) == sum(b.size for b in self.live)
        assert stats.count == len(allocated) == len(self.live)
        for cat in CATEGORIES:
            mine = [b for b in allocated if b["category"] == cat]
            assert stats.by_category[cat].in_use == sum(b["size"] for b in mine)
            assert stats.by_category[cat].count == len(mine)
            assert stats.by_category[cat].peak >= stats.by_category[cat].in_use
        free = [b for b in snap if b["state"] == "free"]
        assert stats.free == sum(b["size"] for b in free)
        assert stats.largest_free == max((b["size"] for b in free), default=0)
        assert stats.pending == sum(b["size"] for b in free if b["stream"] is not None)
        assert stats.peak == self.expected_peak

    def teardown(self):
        if not hasattr(self, "pool"):
            return
        for block in self.live:
            self.pool.free(block)
        self.pool.reclaim(wait=True)
        assert self.pool.snapshot()["blocks"] == [
            {
                "offset": 0,
                "size": CAPACITY,
                "state": "free",
                "category": None,
                "stream": None,
                "requested": 0,
                "ready": True,
            }
        ]
        assert self.pool.stats().in_use == 0


def _covers(waited, event) -> bool:
    """A wait for ``waited`` orders after ``event``: the same stream, as far or further (a merged free
    segment keeps the later of its frees' events)."""
    return waited.stream is event.stream and waited.seq >= event.seq


def _event_at_free(stream):
    """An event equal to the one the pool recorded on ``stream`` at the free just made."""
    return FakeEvent(stream, stream.enqueued)


PoolMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestPoolProperties = PoolMachine.TestCase
