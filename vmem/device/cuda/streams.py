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

__all__ = ["CudaStream", "CudaEvent"]


class CudaEvent:
    """A ``cupy.cuda.Event``; ``timing`` events measure time between them."""

    def __init__(self, event: cupy.cuda.Event, timing: bool):
        self.event = event
        self.timing = timing

    def query(self) -> bool:
        return bool(self.event.done)

    def synchronize(self) -> None:
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

        ev = event if event is not None else CudaEvent(cupy.cuda.Event(disable_timing=not timing), timing)
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
