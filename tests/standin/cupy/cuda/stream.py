"""Streams, events and CUDA graphs on the stand-in: work runs as it is enqueued, so every stream keeps its
order; events record the host's clock.

Stream capture keeps CUDA's rules (``cudaStreamBeginCapture`` in CuPy's default relaxed mode): work enqueued
on a capturing stream is recorded, not run, and runs when the graph is launched; a stream that waits for an
event recorded in a capture joins it; ``end_capture`` refuses a capture that some joined stream was not
joined back from (``cudaErrorStreamCaptureUnjoined``) or that an illegal call invalidated. Synchronizing or
querying a capturing stream, and querying, synchronizing, timing or waiting outside the capture for an
event last recorded in one (``cudaErrorCapturedEvent``), are refused.
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from typing import Any

from .. import _state
from .runtime import CUDARuntimeError

_ids = itertools.count(0x1000, 0x10)
_local = threading.local()
#: live streams by handle (what ``memcpyAsync`` and cuDNN's handles name)
_BY_PTR: "weakref.WeakValueDictionary[int, Stream]" = weakref.WeakValueDictionary()


class Stream:
    null: "Stream"

    def __init__(self, null: bool = False, non_blocking: bool = False, ptds: bool = False, priority: Any = None):
        self.ptr = 0 if null else next(_ids)
        self.non_blocking = non_blocking
        self._entered: list = []
        self._capture: _state.Capture | None = None
        _BY_PTR[self.ptr] = self

    def __enter__(self) -> "Stream":
        self._entered.append(getattr(_local, "stream", None))
        _local.stream = self
        return self

    def __exit__(self, *exc: object) -> None:
        _local.stream = self._entered.pop()

    def use(self) -> "Stream":
        _local.stream = self
        return self

    def _not_capturing(self, what: str) -> None:
        if self._capture is not None:
            _state._refuse(self._capture, f"cudaErrorStreamCaptureUnsupported: {what} of a capturing stream")

    @property
    def done(self) -> bool:
        self._not_capturing("query")
        return True

    def synchronize(self) -> None:
        self._not_capturing("synchronize")

    def wait_event(self, event: "Event") -> None:
        if not isinstance(event, Event):
            raise TypeError(f"wait_event takes an Event, not {type(event).__name__}")
        cap = event._captured
        if cap is not None:
            if cap.ended:
                raise CUDARuntimeError("cudaErrorCapturedEvent: waiting for an event last recorded in a capture")
            if self._capture is None:  # this stream joins the capture
                self._capture = cap
                cap.count.setdefault(self, 0)
                cap.clock.setdefault(self, {})
            elif self._capture is not cap:
                raise CUDARuntimeError("cudaErrorStreamCaptureIsolation: an event of another capture")
            clock = cap.clock[self]
            for s, n in event._clock.items():
                clock[s] = max(clock.get(s, 0), n)
            entry = ("wait", self.ptr, event.ptr)
            cap.trace.append(entry)
            _state.COUNTERS.trace.append(entry)
        if not event._recorded:
            return  # as CUDA: waiting for an event never recorded does not wait

    def record(self, event: "Event | None" = None) -> "Event":
        event = event or Event()
        event.record(self)
        return event

    def launch_host_func(self, fn: Any, arg: Any) -> None:
        self._not_capturing("a host function")
        fn(arg)

    # -- capture ---------------------------------------------------------------------------------------
    def begin_capture(self, mode: Any = None) -> None:
        if self.ptr == 0:
            raise RuntimeError("cannot capture on the default (legacy) stream")
        if self._capture is not None:
            raise CUDARuntimeError("cudaErrorIllegalState: the stream is already capturing")
        self._capture = _state.Capture(self)

    def is_capturing(self) -> bool:
        return self._capture is not None

    def end_capture(self) -> "Graph":
        cap = self._capture
        if cap is None or cap.origin is not self:
            raise CUDARuntimeError("cudaErrorIllegalState: end_capture on a stream that did not begin one")
        cap.ended = True
        joined = cap.clock[self]
        unjoined = [s for s, n in cap.count.items() if s is not self and n > joined.get(s, 0)]
        for s in cap.count:
            s._capture = None
        if cap.invalidated is not None:
            raise CUDARuntimeError(f"cudaErrorStreamCaptureInvalidated: {cap.invalidated}")
        if unjoined:
            raise CUDARuntimeError(
                f"cudaErrorStreamCaptureUnjoined: {', '.join(repr(s) for s in unjoined)} not joined back into "
                "the capture's origin stream"
            )
        return Graph(cap)

    def __repr__(self) -> str:
        return f"<Stream {self.ptr:#x} (stand-in)>"


Stream.null = Stream(null=True)


def get_current_stream() -> Stream:
    return getattr(_local, "stream", None) or Stream.null


def stream_of(ptr: int) -> Stream | None:
    """The live stream whose handle is ``ptr``."""
    return _BY_PTR.get(int(ptr))


class Graph:
    """What a capture recorded, run in its order at each ``launch`` (``cudaGraphLaunch``)."""

    def __init__(self, cap: _state.Capture):
        self._ops = cap.ops
        self.trace = list(cap.trace)

    def upload(self, stream: Any = None) -> None:
        pass

    def launch(self, stream: Any = None) -> None:
        stream = stream or get_current_stream()
        if stream._capture is not None:
            raise CUDARuntimeError("cudaErrorStreamCaptureUnsupported: the stand-in launches no graph in a capture")
        _state.COUNTERS.graph_launches += 1
        _state.COUNTERS.trace.append(("graph", id(self)))
        for work in self._ops:
            work()


class Event:
    def __init__(self, block: bool = False, disable_timing: bool = False, interprocess: bool = False):
        self.disable_timing = disable_timing
        self.ptr = next(_ids)
        self._recorded = False
        self._time = 0.0
        self._captured: _state.Capture | None = None  # the capture it was last recorded in
        self._clock: dict = {}

    def record(self, stream: Stream | None = None) -> None:
        stream = stream or get_current_stream()
        self._recorded = True
        self._time = time.perf_counter()
        cap = stream._capture
        self._captured = cap
        if cap is not None:
            if not self.disable_timing:
                _state.COUNTERS.capture_timing_events += 1
            self._clock = dict(cap.clock[stream])
            self._clock[stream] = cap.count[stream]
            entry = ("record", stream.ptr, self.ptr)  # an edge of the graph: from this point of the stream
            cap.trace.append(entry)
            _state.COUNTERS.trace.append(entry)
        else:
            self._clock = {}

    def _not_captured(self, what: str) -> None:
        if self._captured is not None:
            raise CUDARuntimeError(f"cudaErrorCapturedEvent: {what} of an event last recorded in a capture")

    @property
    def done(self) -> bool:
        self._not_captured("query")
        return True

    def synchronize(self) -> None:
        self._not_captured("synchronize")


def get_elapsed_time(start: Event, end: Event) -> float:
    """Milliseconds between two timing events that were recorded (CUDA refuses others)."""
    if start.disable_timing or end.disable_timing:
        raise CUDARuntimeError("cudaErrorInvalidResourceHandle: an event made with disable_timing=True")
    if not (start._recorded and end._recorded):
        raise CUDARuntimeError("cudaErrorInvalidResourceHandle: an event not recorded")
    start._not_captured("elapsed time")
    end._not_captured("elapsed time")
    return (end._time - start._time) * 1e3
