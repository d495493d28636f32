"""CUDA streams and events behind vmem's Stream and Event protocols (CuPy 14).

``launch(fn, *args)`` runs ``fn`` on the host at once with this stream current: the GPU work ``fn``
enqueues (CuPy kernels, cuDNN calls through a handle bound to the stream, ``memcpyAsync`` on the current
stream) runs asynchronously on the stream, in order. A host-side wait inside ``fn`` (``event.synchronize``)
blocks the enqueueing, not work already enqueued. Streams are non-blocking: they never synchronize with
the legacy default stream.

Events come from a pool (:class:`EventPool`), as PyTorch's caching allocator keeps its events: a
``cupy.cuda.Event`` is made once and recorded again once the :class:`CudaEvent` holding it is dropped
(nobody can then query, time or wait for it; a wait already enqueued took the event's state when it was
enqueued, so recording it again does not move that wait). A step makes events in its first run only.
"""

from __future__ import annotations

from typing import Any, Callable, TYPE_CHECKING

if TYPE_CHECKING:
    import cupy

    from .graphs import Token

__all__ = ["CudaStream", "CudaEvent", "EventPool"]


class EventPool:
    """``cupy.cuda.Event`` objects to record again, timing and not (``made``: how many were ever made)."""

    def __init__(self) -> None:
        self._free: dict[bool, list[cupy.cuda.Event]] = {True: [], False: []}
        self.made = 0

    def take(self, timing: bool) -> "CudaEvent":
        """An event to record: a free one, or a new one where none is free."""
        free = self._free[timing]
        if free:
            event = free.pop()
        else:
            import cupy

            event = cupy.cuda.Event(disable_timing=not timing)
            self.made += 1
        return CudaEvent(event, timing, pool=free)

    def free(self, timing: bool) -> int:
        """How many events of the kind wait to be recorded again."""
        return len(self._free[timing])


class CudaEvent:
    """A ``cupy.cuda.Event``; ``timing`` events measure time between them. One recorded during a stream
    capture (``captured``: the capture's :class:`~.graphs.Token`) stands for work of a graph, which CUDA
    does not let the host query or wait for: it is done once the token says the graph has run."""

    __slots__ = ("event", "timing", "captured", "_pool")

    def __init__(
        self,
        event: cupy.cuda.Event,
        timing: bool,
        captured: Token | None = None,
        pool: list[cupy.cuda.Event] | None = None,
    ):
        self.event = event
        self.timing = timing
        self.captured = captured
        self._pool = pool  # where the event goes back to once this is dropped (an :class:`EventPool`'s list)

    def __del__(self) -> None:
        pool = self._pool
        if pool is not None:
            self._pool = None
            pool.append(self.event)

    def query(self) -> bool:
        if self.captured is not None:
            return bool(self.captured.done)
        return bool(self.event.done)

    def synchronize(self) -> None:
        if self.captured is not None:
            if not self.captured.done:
                raise RuntimeError("the host cannot wait for work a CUDA graph is capturing")
            return
        self.event.synchronize()

    def elapsed_time(self, end: "CudaEvent") -> float:
        import cupy

        return cupy.cuda.get_elapsed_time(self.event, end.event) / 1e3


class CudaStream:
    """A non-blocking ``cupy.cuda.Stream`` named for the timeline (``"compute"``, ``"memory"``); its events
    from ``events`` (one pool per device, shared by its streams)."""

    def __init__(self, name: str, events: EventPool | None = None):
        import cupy

        self.name = name
        self.events = events if events is not None else EventPool()
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.allocator: Any = None  # CuPy's allocator while work runs (the device routes it to its pool)
        #: the token of the capture this stream takes part in (:mod:`.graphs`), None when it runs its work
        self.capture: Token | None = None
        self._closed = False

    @property
    def ptr(self) -> int:
        return self.stream.ptr

    def launch(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        import cupy

        with self.stream:
            if self.allocator is None:
                fn(*args, **kwargs)
                return
            with cupy.cuda.using_allocator(self.allocator.malloc):
                fn(*args, **kwargs)

    def record(self, event: CudaEvent | None = None, *, timing: bool = False) -> CudaEvent:
        if self.capture is not None:  # a captured event: never timed, answered for by the capture's token
            ev = event if event is not None and not event.timing else self.events.take(False)
            ev.captured = self.capture
        else:
            ev = event if event is not None else self.events.take(timing)
            ev.captured = None
        ev.event.record(self.stream)
        return ev

    def wait(self, event: CudaEvent) -> None:
        self.stream.wait_event(event.event)

    def query(self) -> bool:
        return bool(self.stream.done)

    def synchronize(self) -> None:
        self.stream.synchronize()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.stream.synchronize()

    def __repr__(self) -> str:
        return f"CudaStream({self.name!r}, ptr={self.stream.ptr:#x})"
