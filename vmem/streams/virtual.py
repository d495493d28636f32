"""Virtual streams: CUDA stream semantics with nothing running, for planning, simulated GPUs and tests.

A :class:`VirtualStream` counts the work enqueued on it and keeps a clock. Work completes only when
someone says so, never by itself: :meth:`VirtualStream.advance` (a test moving the stream on) or a host
wait (``synchronize`` of the stream or of an event). That makes the pool's stream-ordered reuse
deterministic in a replay, independent of timing, as the executor's placement is.

The clock is the simulated device's: :meth:`VirtualStream.run` enqueues work of a given duration,
``wait(event)`` moves the clock to the event's time (the stream cannot run ahead of what it waits for),
and an event carries the clock at its record. The streams of one device share a :class:`HostClock`:
when the host waits (``synchronize`` of a stream or an event) it stands still until that point, so work
enqueued after the wait starts no earlier than it (:meth:`VirtualStream.catch_up` says how long a stream
stood idle for it). ``launch`` only records the call: a virtual stream runs
no code, unless made with ``execute=True``: then it runs each call at once, on the calling thread, and
its work is complete as soon as it is enqueued (a synchronous stand-in for tests of the executor).
"""

from __future__ import annotations

from typing import Any, Callable, TYPE_CHECKING

if TYPE_CHECKING:
    from ..streams.base import Event

__all__ = ["VirtualStream", "VirtualEvent", "HostClock"]


class HostClock:
    """The host's place on the device's clock: the latest point it has waited for."""

    __slots__ = ("time",)

    def __init__(self) -> None:
        self.time = 0.0

    def reach(self, time: float) -> None:
        if time > self.time:
            self.time = time


class VirtualEvent:
    """A point in a virtual stream: its sequence number and the stream's clock when it was recorded."""

    __slots__ = ("stream", "seq", "time", "timing")

    def __init__(self, stream: "VirtualStream", seq: int, time: float = 0.0, timing: bool = False):
        self.stream = stream
        self.seq = seq
        self.time = time
        self.timing = timing

    def query(self) -> bool:
        return self.stream.completed >= self.seq

    def synchronize(self) -> None:
        """The host waited: the stream has reached this point, and so has the host's clock."""
        self.stream.completed = max(self.stream.completed, self.seq)
        self.stream.host_waits += 1
        self.stream.host.reach(self.time)

    def elapsed_time(self, end: "VirtualEvent") -> float:
        return end.time - self.time


class VirtualStream:
    """A stream with a virtual clock. ``advance(k)`` completes the next ``k`` items (all by default).
    Streams given the same ``host`` (a :class:`HostClock`; by default one of its own) share the host's
    waits."""

    def __init__(self, name: str, *, execute: bool = False, host: HostClock | None = None):
        self.name = name
        self.execute = execute
        self.host = HostClock() if host is None else host
        self.clock = 0.0
        self.enqueued = 0
        self.completed = 0
        self.host_waits = 0
        self.closed = False
        self.launched: list[tuple[Callable[..., Any], tuple, dict]] = []

    def launch(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Record the call; with ``execute=True`` run it now (its work is then complete)."""
        self.enqueued += 1
        self.launched.append((fn, args, kwargs))
        if self.execute:
            fn(*args, **kwargs)
            self.completed = self.enqueued

    def catch_up(self) -> float:
        """Move the clock to where the host last waited, if it is behind: work enqueued from now on starts no
        earlier. Returns how long the stream stood idle for it."""
        idle = self.host.time - self.clock
        if idle <= 0.0:
            return 0.0
        self.clock = self.host.time
        return idle

    def run(self, seconds: float) -> float:
        """Enqueue work that takes ``seconds`` of this stream's clock; returns the clock after it."""
        self.catch_up()
        self.enqueued += 1
        self.clock += max(0.0, seconds)
        return self.clock

    def record(self, event: Event | None = None, *, timing: bool = False) -> VirtualEvent:
        self.catch_up()
        self.enqueued += 1
        if self.execute:
            self.completed = self.enqueued
        return VirtualEvent(self, self.enqueued, self.clock, timing)

    def wait(self, event: VirtualEvent) -> float:
        """Later work waits for ``event``; returns how long this stream's clock stood still for it."""
        self.catch_up()
        waited = max(0.0, event.time - self.clock)
        self.clock += waited
        return waited

    def advance(self, k: int | None = None) -> None:
        self.completed = self.enqueued if k is None else min(self.enqueued, self.completed + k)

    def query(self) -> bool:
        return self.completed >= self.enqueued

    def synchronize(self) -> None:
        self.completed = self.enqueued
        self.host_waits += 1
        self.host.reach(self.clock)

    def close(self) -> None:
        self.synchronize()
        self.closed = True

    def __repr__(self) -> str:
        return f"VirtualStream({self.name!r}, clock={self.clock:.6g}s, {self.completed}/{self.enqueued} done)"
