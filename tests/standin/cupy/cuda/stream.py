"""Streams and events on the stand-in: work runs as it is enqueued, so every stream keeps its order; events
record the host's clock."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

from .runtime import CUDARuntimeError

_ids = itertools.count(0x1000, 0x10)
_local = threading.local()


class Stream:
    null: "Stream"

    def __init__(self, null: bool = False, non_blocking: bool = False, ptds: bool = False, priority: Any = None):
        self.ptr = 0 if null else next(_ids)
        self.non_blocking = non_blocking
        self._entered: list = []

    def __enter__(self) -> "Stream":
        self._entered.append(getattr(_local, "stream", None))
        _local.stream = self
        return self

    def __exit__(self, *exc: object) -> None:
        _local.stream = self._entered.pop()

    def use(self) -> "Stream":
        _local.stream = self
        return self

    @property
    def done(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def wait_event(self, event: "Event") -> None:
        if not isinstance(event, Event):
            raise TypeError(f"wait_event takes an Event, not {type(event).__name__}")
        if not event._recorded:
            return  # as CUDA: waiting for an event never recorded does not wait

    def record(self, event: "Event | None" = None) -> "Event":
        event = event or Event()
        event.record(self)
        return event

    def launch_host_func(self, fn: Any, arg: Any) -> None:
        fn(arg)

    def __repr__(self) -> str:
        return f"<Stream {self.ptr:#x} (stand-in)>"


Stream.null = Stream(null=True)


def get_current_stream() -> Stream:
    return getattr(_local, "stream", None) or Stream.null


class Event:
    def __init__(self, block: bool = False, disable_timing: bool = False, interprocess: bool = False):
        self.disable_timing = disable_timing
        self.ptr = next(_ids)
        self._recorded = False
        self._time = 0.0

    def record(self, stream: Stream | None = None) -> None:
        self._recorded = True
        self._time = time.perf_counter()

    @property
    def done(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


def get_elapsed_time(start: Event, end: Event) -> float:
    """Milliseconds between two timing events that were recorded (CUDA refuses others)."""
    if start.disable_timing or end.disable_timing:
        raise CUDARuntimeError("cudaErrorInvalidResourceHandle: an event made with disable_timing=True")
    if not (start._recorded and end._recorded):
        raise CUDARuntimeError("cudaErrorInvalidResourceHandle: an event not recorded")
    return (end._time - start._time) * 1e3
