"""The Stream and Event protocols every device implements, with CUDA's semantics.

A stream runs the work enqueued on it in order, asynchronously to the host. An event marks a point in a
stream: it completes once all work enqueued on that stream before it was recorded has finished. A stream
can wait for an event of another stream (the stream waits, the host does not); the host can wait for an
event or for a whole stream. An exception raised by enqueued work surfaces on the host at the next
synchronization. Times are in seconds.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable

__all__ = ["Stream", "Event", "elapsed_time"]


@runtime_checkable
class Event(Protocol):
    """A point in a stream's work."""

    timing: bool

    def query(self) -> bool:
        """True once the work before the recorded point has finished (True if never recorded)."""
        ...

    def synchronize(self) -> None:
        """Block the host until the event completes; re-raise an error of the work before it."""
        ...

    def elapsed_time(self, end: Any) -> float:
        """Seconds between this event and ``end`` (an event of the same device: hence Any); both must be
        timing events and completed."""
        ...


@runtime_checkable
class Stream(Protocol):
    """An in-order queue of asynchronous work."""

    name: str

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has run: all the stream's work has finished."""
        ...

    def launch(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Enqueue ``fn(*args, **kwargs)``; it runs after everything enqueued before it."""
        ...

    # an event parameter is this device's own kind of Event (a stream waits only on its device's events): Any

    def record(self, event: Any = None, *, timing: bool = False) -> Event:
        """Record ``event`` (or a new one) at the current end of this stream and return it."""
        ...

    def wait(self, event: Any) -> object:
        """Make work enqueued on this stream from now on wait until ``event`` completes."""
        ...

    def query(self) -> bool:
        """True if all work enqueued so far has finished."""
        ...

    def synchronize(self) -> None:
        """Block the host until all enqueued work finishes; re-raise the first error it raised."""
        ...

    def close(self) -> None:
        """Finish the enqueued work and release the stream's resources (idempotent)."""
        ...


def elapsed_time(start: Event, end: Event) -> float:
    """Seconds from ``start`` to ``end`` (both recorded with ``timing=True``, both completed)."""
    return start.elapsed_time(end)
