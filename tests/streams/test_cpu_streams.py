"""CPU streams and events: CUDA semantics on worker threads."""

from __future__ import annotations

import gc
import threading
import time
import traceback

import pytest

from tests.conftest import stream_threads
from vmem.streams import CpuEvent, CpuStream, Event, Stream, elapsed_time
from vmem.streams.cpu import held


@pytest.fixture
def streams():
    a, b = CpuStream("a"), CpuStream("b")
    yield a, b
    a.close()
    b.close()


def test_protocols():
    with CpuStream("p") as s:
        assert isinstance(s, Stream)
        assert isinstance(s.record(), Event)


def test_work_runs_in_order_and_asynchronously(streams):
    a, _ = streams
    gate = threading.Event()
    out = []
    a.launch(gate.wait)
    for i in range(100):
        a.launch(out.append, i)
    assert out == [] and not a.query() and a.pending == 101  # the host was not blocked
    gate.set()
    a.synchronize()
    assert out == list(range(100)) and a.query()


def test_an_event_completes_when_the_work_before_it_has(streams):
    a, _ = streams
    gate = threading.Event()
    assert CpuEvent().query()  # never recorded: complete, as in CUDA
    a.launch(gate.wait)
    ev = a.record()
    assert not ev.query()
    gate.set()
    ev.synchronize()
    assert ev.query()


def test_cross_stream_wait_blocks_the_stream_not_the_host(streams):
    a, b = streams
    gate = threading.Event()
    out = []
    a.launch(gate.wait)
    a.launch(out.append, "a")
    b.wait(a.record())
    b.launch(out.append, "b")
    time.sleep(0.05)
    assert out == [] and not b.query()  # b waits; we (the host) are running
    gate.set()
    b.synchronize()
    assert out == ["a", "b"]


def test_wait_on_an_event_recorded_later_does_not_apply(streams):
    a, b = streams
    ev = CpuEvent()
    b.wait(ev)  # not recorded yet: no-op, like cudaStreamWaitEvent on a fresh event
    b.launch(lambda: None)
    b.synchronize()
    a.record(ev)
    ev.synchronize()


def test_an_exception_surfaces_at_sync_with_its_traceback(streams):
    a, _ = streams
    out = []

    def boom():
        raise ValueError("kernel failed")

    a.launch(out.append, 1)
    a.launch(boom)
    a.launch(out.append, 2)  # skipped: the stream is in error until the host hears of it
    with pytest.raises(ValueError, match="kernel failed") as info:
        a.synchronize()
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert "boom" in frames
    assert out == [1]
    a.launch(out.append, 3)  # reported once; the stream works again
    a.synchronize()
    assert out == [1, 3]


def test_an_event_after_the_error_reports_it_and_waiters_do_not_hang(streams):
    a, b = streams
    a.launch(lambda: 1 / 0)
    ev = a.record()
    b.wait(ev)  # b must not hang on a failed stream
    b.launch(lambda: None)
    b.synchronize()
    with pytest.raises(ZeroDivisionError):
        ev.synchronize()
    a.synchronize()  # already reported


def test_an_event_before_the_error_does_not_report_it(streams):
    a, _ = streams
    gate = threading.Event()
    a.launch(gate.wait)
    ev = a.record()
    a.launch(lambda: 1 / 0)
    gate.set()
    ev.synchronize()
    with pytest.raises(ZeroDivisionError):
        a.synchronize()


def test_timing_events_measure_elapsed_seconds(streams):
    a, _ = streams
    start = a.record(timing=True)
    a.launch(time.sleep, 0.03)
    end = a.record(timing=True)
    end.synchronize()
    assert 0.025 < elapsed_time(start, end) < 1.0
    with pytest.raises(RuntimeError, match="timing=True"):
        elapsed_time(a.record(), end)


def test_closed_streams_reject_work_and_leave_no_thread():
    before = len(stream_threads())
    s = CpuStream("c")
    out = []
    s.launch(time.sleep, 0.02)
    s.launch(out.append, 1)
    s.close()  # finishes the enqueued work first
    assert out == [1]
    assert len(stream_threads()) == before
    with pytest.raises(RuntimeError, match="closed"):
        s.launch(out.append, 2)
    s.close()  # idempotent


def test_close_reraises_a_pending_error():
    s = CpuStream("e")
    s.launch(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        s.close()


def test_a_dropped_stream_stops_its_thread():
    before = len(stream_threads())
    s = CpuStream("dropped")
    s.launch(lambda: None)
    del s
    gc.collect()
    for t in stream_threads()[before:]:
        t.join(timeout=5)
    assert len(stream_threads()) == before


def test_wrong_event_types_are_rejected(streams):
    a, _ = streams
    with pytest.raises(TypeError, match="CpuEvent"):
        a.wait(object())
    with pytest.raises(TypeError, match="CpuEvent"):
        a.record(object())


def test_many_host_threads_waiting_on_different_points_all_wake(streams):
    a, _ = streams
    gate = threading.Event()
    a.launch(gate.wait)
    events = []
    for _ in range(5):
        a.launch(time.sleep, 0.001)
        events.append(a.record())
    woke = []
    threads = [
        threading.Thread(target=lambda e=e, i=i: (e.synchronize(), woke.append(i))) for i, e in enumerate(events)
    ]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join(timeout=5)
    assert sorted(woke) == list(range(5))


def _a_then_b(a, b, out):
    """Enqueue: a appends "a"; b, after a's work, appends "b"."""
    a.launch(out.append, "a")
    b.wait(a.record())
    b.launch(out.append, "b")


def test_held_streams_start_their_work_when_the_batch_is_in(streams):
    a, b = streams
    out = []
    with held(a, b):
        _a_then_b(a, b, out)
        time.sleep(0.05)
        assert out == [] and a.pending == 1  # asleep while the host enqueues
    b.synchronize()
    assert out == ["a", "b"]
    with held(a):  # and they run normally afterwards
        pass
    a.launch(out.append, "c")
    a.synchronize()
    assert out == ["a", "b", "c"]


def test_a_wait_inside_a_held_batch_wakes_the_streams_it_depends_on(streams):
    """The host waits on b, which waits on a: both held, neither may stay asleep (no deadlock)."""
    a, b = streams
    out = []
    with held(a, b):
        _a_then_b(a, b, out)
        done = b.record()
        waiter = threading.Thread(target=done.synchronize)  # another thread's wait wakes them too
        waiter.start()
        waiter.join(timeout=10)
        assert not waiter.is_alive() and out == ["a", "b"]
        a.launch(out.append, "a2")
        a.synchronize()  # the host's own wait
        assert out == ["a", "b", "a2"]


def test_a_busy_worker_takes_held_work_without_being_woken(streams):
    a, _ = streams
    gate = threading.Event()
    out = []
    a.launch(gate.wait)  # the worker is busy, not asleep
    with held(a):
        a.launch(out.append, 1)
        gate.set()
        a.record().synchronize()
    assert out == [1]
