"""Virtual streams: clocks, waits between streams, and the host's waits that hold back later work."""

from __future__ import annotations

import pytest

from vmem.streams import HostClock, VirtualStream


def test_a_stream_waiting_for_another_moves_its_clock_to_the_event():
    compute, memory = VirtualStream("compute"), VirtualStream("memory")
    compute.run(1.0)
    memory.wait(compute.record())
    memory.run(2.0)
    done = memory.record()
    assert compute.wait(done) == pytest.approx(2.0) and compute.clock == pytest.approx(3.0)


def test_work_enqueued_after_a_host_wait_starts_no_earlier_than_it():
    host = HostClock()
    compute, memory = VirtualStream("compute", host=host), VirtualStream("memory", host=host)
    compute.run(1.0)
    memory.run(3.0)
    copy = memory.record()
    assert compute.clock == pytest.approx(1.0)  # nothing has waited yet
    copy.synchronize()  # the host blocks until the copy is done, then enqueues more compute
    assert host.time == pytest.approx(3.0) and memory.host_waits == 1
    assert compute.catch_up() == pytest.approx(2.0) and compute.catch_up() == 0.0
    assert compute.run(1.0) == pytest.approx(4.0)
    memory.synchronize()  # a wait already passed costs nothing more
    assert compute.run(0.5) == pytest.approx(4.5)


def test_streams_of_different_hosts_do_not_hold_each_other_back():
    a, b = VirtualStream("a"), VirtualStream("b")
    b.run(5.0)
    b.record().synchronize()
    assert a.run(1.0) == pytest.approx(1.0)
