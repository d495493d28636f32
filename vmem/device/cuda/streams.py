"""CUDA streams and events behind vmem's Stream and Event protocols (CuPy 14).

``launch(fn, *args)`` runs ``fn`` on the host at once with this stream current: the GPU work ``fn``
enqueues (CuPy kernels, cuDNN calls through a handle bound to the stream, ``memcpyAsync`` on the current
stream) runs asynchronously on the stream, in order. A host-side wait inside ``fn`` (``event.synchronize``)
blocks the enqueueing, not work already enqueued. Streams are non-blocking: they never synchronize with
the legacy default stream.
"""

from __future__ import annotations

from typing import Any, Callable, TYPE_CHECKING

if TYPE_CHECKING:
    import cupy

    from .graphs import Token

__all__ = ["CudaStream", "CudaEvent"]


class CudaEvent:
    """A ``cupy.cuda.Event``; ``timing`` events measure time between them. One recorded during a stream
    capture (``captured``: the capture's :class:`~.graphs.Token`) stands for work of a graph, which CUDA
    does not let the host query or wait for: it is done once the token says the graph has run."""

    __slots__ = ("event", "timing", "captured")

    def __init__(self, event: cupy.cuda.Event, timing: bool, captured: Token | None = None):
        self.event = event
        self.timing = timing
        self.captured = captured

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
    """A non-blocking ``cupy.cuda.Stream`` named for the timeline (``"compute"``, ``"memory"``)."""

    def __init__(self, name: str):
        import cupy

        self.name = name
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
        import cupy

        if self.capture is not None:  # a captured event: never timed, answered for by the capture's token
            ev = (
                event
                if event is not None and not event.timing
                else CudaEvent(cupy.cuda.Event(disable_timing=True), False)
            )
            ev.captured = self.capture
        else:
            ev = event if event is not None else CudaEvent(cupy.cuda.Event(disable_timing=not timing), timing)
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
