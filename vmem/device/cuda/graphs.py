"""CUDA graphs of a step: work enqueued on the device's streams recorded once and replayed by one launch.

:class:`Capture` is what ``CudaDevice.capture()`` returns: entered, the compute stream begins a capture
(CuPy's default relaxed mode), the memory stream joins it through an event, and CuPy's allocator is routed
to a pool of the graph's own; left, the memory stream is joined back and the capture ends into a
:class:`Graph`. What the block enqueued did not run: ``Graph.launch`` runs it, as many times as asked, at
the same addresses.

The rules that make a replay the step it recorded, and how each is kept:

- Every buffer the graph reads or writes is where it was at capture. The device pool's blocks are the
  executor's to keep free (it replays only while the pool is as it left it); CuPy's temporaries made during
  the capture come from the graph's own pool, which nothing else draws from and which lives as long as the
  graph (PyTorch's graph pools keep the same rule). With ``temporaries="pool"`` they would come from the
  device pool and be handed to other work once freed: the device refuses graphs then.
- No work may wait for the host inside a capture: a synchronization, a read to the host, a copy from
  pageable memory or a host function fails it (CUDA invalidates the capture); the executor then runs the
  step without a graph and says why.
- Events recorded during the capture are "captured events": CUDA refuses to query, synchronize or time
  them. :class:`~.streams.CudaEvent` answers for them from the capture's :class:`Token` instead: not done
  until the graph has run once and the device has been synchronized. Timing events are not recorded in a
  capture (the streams make plain ones).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    import cupy

    from ...streams.base import Stream
    from .device import CudaDevice
    from .streams import CudaStream

__all__ = ["Capture", "Graph", "Token"]


class Token:
    """What the events recorded in one capture report: ``done`` once the work they stand for has run."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = False


class Graph:
    """An instantiated CUDA graph (CuPy's), with the pool its temporaries live in and the token of its
    capture's events."""

    def __init__(self, graph: cupy.cuda.graph.Graph, pool: cupy.cuda.MemoryPool, token: Token):
        self.graph: cupy.cuda.graph.Graph | None = graph
        self.pool: cupy.cuda.MemoryPool | None = pool
        self.token = token

    def launch(self, stream: Stream) -> None:
        """Enqueue the whole graph on ``stream`` (one of the device's :class:`~.streams.CudaStream`)."""
        if self.graph is None:
            raise RuntimeError("a closed CUDA graph cannot be launched")
        self.graph.launch(cast("CudaStream", stream).stream)

    def ran(self) -> None:
        """The graph has run and the device was synchronized after it: its capture's events are complete."""
        self.token.done = True

    def close(self) -> None:
        """Give the graph's temporaries back to the driver (nothing may launch it after)."""
        self.token.done = True
        if self.pool is not None:
            self.pool.free_all_blocks()
            self.pool = None
        self.graph = None


class Capture:
    """A capture of the work enqueued on ``device``'s compute and memory streams (see the module docstring);
    ``graph`` is set when the block ends without an error. Failing, the capture is ended and dropped; none of
    its work ran, so its events count as done."""

    def __init__(self, device: CudaDevice):
        import cupy

        self.device = device
        self.token = Token()
        self.pool = cupy.cuda.MemoryPool()
        self.graph: Graph | None = None
        self._allocator: contextlib.AbstractContextManager[None] | None = None

    def __enter__(self) -> "Capture":
        import cupy

        cs, ms = self.device.compute_stream, self.device.memory_stream
        allocator = self._allocator = cupy.cuda.using_allocator(self.pool.malloc)
        allocator.__enter__()
        try:
            cs.stream.begin_capture()
            cs.capture = ms.capture = self.token
            ms.wait(cs.record())  # the memory stream joins the capture
        except BaseException:
            cs.capture = ms.capture = None
            allocator.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        cs, ms = self.device.compute_stream, self.device.memory_stream
        try:
            if kind is None:
                cs.wait(ms.record())  # and is joined back before the capture ends
            graph = cs.stream.end_capture()
        except BaseException:
            self.token.done = True  # nothing of the capture ran, nor will
            if kind is None:
                raise
            return  # the block's own error is the one to report
        finally:
            cs.capture = ms.capture = None
            if self._allocator is not None:
                self._allocator.__exit__(None, None, None)
        if kind is not None:
            self.token.done = True
            return
        self.graph = Graph(graph, self.pool, self.token)
