"""CPU streams: one worker thread per stream, with CUDA stream and event semantics.

Events cost almost nothing: a stream counts the work items enqueued and completed, and an event is the
pair (stream, count at record time); it has completed when the stream's completed count reaches it.
Only timing events enqueue a marker that stamps the clock when the stream reaches it, as CUDA's timing
events do.

Errors: the first exception raised by a work item is kept with its traceback; later items on that stream
are skipped (their events still complete, so nothing waiting on them hangs) until the error is re-raised
on the host by ``Stream.synchronize`` or by ``Event.synchronize`` of an event recorded after it. Then the
stream runs normally again.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
import weakref
from collections import deque
from typing import Any, Callable, Iterator

__all__ = ["CpuStream", "CpuEvent", "THREAD_PREFIX", "held"]

#: Name prefix of every stream worker thread (tests look for leftovers by it).
THREAD_PREFIX = "vmem-stream"

_STOP = object()
_NEVER = float("inf")
_ids = itertools.count()


class _State:
    """What the worker thread shares with the host; holds no reference to the Stream object."""

    __slots__ = (
        "name",
        "lock",
        "work",
        "done",
        "queue",
        "enqueued",
        "completed",
        "error",
        "error_seq",
        "closed",
        "waiters",
        "wake_at",
        "idle",
        "held",
    )

    def __init__(self, name: str):
        self.name = name
        self.lock = threading.Lock()
        self.work = threading.Condition(self.lock)  # the worker waits here for items
        self.done = threading.Condition(self.lock)  # the host and other streams wait here for progress
        self.queue: deque = deque()
        self.enqueued = 0
        self.completed = 0
        self.error: BaseException | None = None
        self.error_seq = 0
        self.closed = False
        # Counts that threads are waiting for; the worker wakes them only when the smallest is reached,
        # not after every item (waking a waiter costs both threads a round of the GIL).
        self.waiters: list[int] = []
        self.wake_at = _NEVER
        self.idle = False  # the worker waits for work: an enqueue wakes it (else it finds the item itself)
        self.held = False  # enqueues leave the idle worker asleep (see held())

    def wake(self) -> None:
        """Wake the idle worker if work waits for it."""
        with self.lock:
            if self.idle and self.queue:
                self.work.notify()

    def wait_for(self, seq: int) -> None:
        if self.completed >= seq:
            return
        if _HELD:  # a held stream's work may be what this waits for, through another stream's wait
            _wake_held()
        with self.lock:
            if self.completed >= seq:
                return
            self.waiters.append(seq)
            self.wake_at = min(self.wake_at, seq)
            while self.completed < seq:
                self.done.wait()
            self.waiters.remove(seq)
            self.wake_at = min(self.waiters, default=_NEVER)

    def take_error(self, upto: int | None = None) -> BaseException | None:
        with self.lock:
            error = self.error
            if error is None or (upto is not None and self.error_seq > upto):
                return None
            self.error = None
            return error


#: the states of held streams (see held()); a thread that waits on any stream wakes them all first
_HELD: set[_State] = set()
_HELD_LOCK = threading.Lock()


def _wake_held() -> None:
    with _HELD_LOCK:
        states = list(_HELD)
    for state in states:
        state.wake()


@contextlib.contextmanager
def held(*streams: "CpuStream") -> Iterator[None]:
    """Enqueue a batch of work on ``streams`` without waking their idle workers until the batch is in
    (the body ends) or some thread waits for a stream's progress, whichever comes first.

    A worker needs the interpreter's lock, which the host holds while it enqueues: woken at the first
    item, it would wait on the host (and the host on it) at every switch of the lock, and start its
    first item only after the host's time slice. Held, it starts once the host has let go."""
    states = [stream._state for stream in streams]
    with _HELD_LOCK:
        fresh = [state for state in states if not state.held]
        for state in fresh:
            state.held = True
            _HELD.add(state)
    try:
        yield
    finally:
        with _HELD_LOCK:
            for state in fresh:
                state.held = False
                _HELD.discard(state)
        for state in fresh:
            state.wake()


def _worker(state: _State) -> None:
    queue = state.queue
    lock = state.lock
    lock.acquire()
    try:
        while True:
            while not queue:
                state.idle = True
                state.work.wait()
                state.idle = False
            item = queue.popleft()
            if item is _STOP:
                return
            lock.release()
            try:
                if state.error is None:
                    fn, args, kwargs = item
                    try:
                        fn(*args, **kwargs)
                    except BaseException as exc:  # kept and re-raised on the host at sync
                        state.error = exc
                        state.error_seq = state.completed + 1
                del item
            finally:
                lock.acquire()
            state.completed += 1
            if state.completed >= state.wake_at:
                state.done.notify_all()
    finally:
        state.closed = True
        state.completed = state.enqueued  # nothing left will run: release every waiter
        state.done.notify_all()
        lock.release()


def _shutdown(state: _State, thread: threading.Thread) -> None:
    with state.lock:
        if not state.closed:
            state.closed = True
            state.queue.append(_STOP)
            state.work.notify()
    if thread is not threading.current_thread():
        thread.join()


def _raise(error: BaseException) -> None:
    raise error.with_traceback(error.__traceback__)


class CpuEvent:
    """A point in a :class:`CpuStream`; see :class:`vmem.streams.Event`."""

    __slots__ = ("_state", "_seq", "timing", "_time", "__weakref__")

    def __init__(self, timing: bool = False):
        self._state: _State | None = None
        self._seq = 0
        self.timing = timing
        self._time: float | None = None

    def record(self, stream: "CpuStream") -> "CpuEvent":
        """Record this event at the current end of ``stream`` (as ``stream.record(self)``)."""
        return stream.record(self)

    def query(self) -> bool:
        state = self._state
        return state is None or state.completed >= self._seq

    def synchronize(self) -> None:
        state = self._state
        if state is None:
            return
        state.wait_for(self._seq)
        error = state.take_error(upto=self._seq)
        if error is not None:
            _raise(error)

    def elapsed_time(self, end: "CpuEvent") -> float:
        for name, ev in (("start", self), ("end", end)):
            if not ev.timing:
                raise RuntimeError(f"elapsed_time: the {name} event was not created with timing=True")
            if ev._state is None:
                raise RuntimeError(f"elapsed_time: the {name} event was never recorded")
            if not ev.query() or ev._time is None:
                raise RuntimeError(f"elapsed_time: the {name} event has not completed yet")
        return end._time - self._time  # type: ignore[operator]

    def __repr__(self) -> str:
        where = "unrecorded" if self._state is None else f"{self._state.name}@{self._seq}"
        return f"CpuEvent({where}, done={self.query()})"


def _stamp(event: CpuEvent) -> None:
    event._time = time.perf_counter()


def _wait_quietly(state: _State, seq: int) -> None:
    # A stream waiting on another stream's event: the other stream's error is its own to report.
    state.wait_for(seq)


class CpuStream:
    """An in-order work queue served by one worker thread; see :class:`vmem.streams.Stream`."""

    def __init__(self, name: str = "stream"):
        self.name = name
        self._state = _State(name)
        self._thread = threading.Thread(
            target=_worker, args=(self._state,), name=f"{THREAD_PREFIX}-{name}-{next(_ids)}", daemon=True
        )
        self._thread.start()
        self._finalizer = weakref.finalize(self, _shutdown, self._state, self._thread)

    # -- work ----------------------------------------------------------------------------------------
    def _enqueue(self, item: Any) -> int:
        state = self._state
        with state.lock:
            if state.closed:
                raise RuntimeError(f"stream {self.name!r} is closed")
            state.queue.append(item)
            state.enqueued += 1
            if state.idle and not state.held:
                state.work.notify()
            return state.enqueued

    def launch(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Enqueue ``fn(*args, **kwargs)`` to run after everything enqueued before it."""
        self._enqueue((fn, args, kwargs))

    def record(self, event: CpuEvent | None = None, *, timing: bool = False) -> CpuEvent:
        """Record ``event`` (or a new one; ``timing=True`` stamps the clock) at the end of this stream."""
        if event is None:
            event = CpuEvent(timing=timing)
        elif not isinstance(event, CpuEvent):
            raise TypeError(f"stream {self.name!r} can only record a CpuEvent, not {type(event).__name__}")
        state = self._state
        if event.timing:
            event._time = None
            event._state = state
            event._seq = self._enqueue((_stamp, (event,), {}))
        else:
            if state.closed:
                raise RuntimeError(f"stream {self.name!r} is closed")
            event._state = state
            event._seq = state.enqueued
        return event

    def wait(self, event: CpuEvent) -> None:
        """Work enqueued on this stream from now on starts only after ``event`` completes."""
        if not isinstance(event, CpuEvent):
            raise TypeError(f"stream {self.name!r} can only wait on a CpuEvent, not {type(event).__name__}")
        state = event._state
        if state is None or state is self._state or state.completed >= event._seq:
            return  # never recorded, recorded on this stream (already ordered), or already complete
        self._enqueue((_wait_quietly, (state, event._seq), {}))

    # -- host side ---------------------------------------------------------------------------------
    def query(self) -> bool:
        state = self._state
        return state.completed >= state.enqueued

    def synchronize(self) -> None:
        state = self._state
        state.wait_for(state.enqueued)
        error = state.take_error()
        if error is not None:
            _raise(error)

    def close(self) -> None:
        """Finish the enqueued work, stop the worker thread and re-raise any pending error."""
        if self._finalizer.alive:
            self._finalizer()  # enqueue the stop marker and join the thread
        error = self._state.take_error()
        if error is not None:
            _raise(error)

    @property
    def closed(self) -> bool:
        return self._state.closed

    @property
    def pending(self) -> int:
        """Number of work items enqueued and not yet finished."""
        state = self._state
        return state.enqueued - state.completed

    def __enter__(self) -> "CpuStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.pending} pending"
        return f"CpuStream({self.name!r}, {state})"
