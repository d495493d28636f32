"""What the stand-in counts and holds: device memory regions by address, host reads, uploads and launches."""

from __future__ import annotations

import bisect
import threading
import traceback
from dataclasses import dataclass, field

import numpy as np

ALIGN = 256


@dataclass
class Counters:
    """Everything a test may ask of a run: reads of device values to the host, implicit (``bool``, ``int``,
    ``float`` of a device array: a hidden synchronization on a GPU) and explicit (``get``, ``asnumpy``,
    ``item``), host arrays turned into device arrays (``asarray``, assignment from a NumPy array), kernel
    launches by name, copies and fills through the runtime, and allocations from the array module."""

    implicit_reads: list = field(default_factory=list)  # (kind, where) of each
    explicit_reads: int = 0
    uploads: list = field(default_factory=list)  # where each was made
    launches: dict = field(default_factory=dict)  # vmem's kernels by name
    calls: dict = field(default_factory=dict)  # the array module's kernels (element-wise, reductions, copies)
    copies: int = 0
    memsets: int = 0
    #: what a CUDA graph would capture, in order: ("kernel", name, arguments), ("copy", dst, src, bytes,
    #: kind), ("memset", ptr, byte, bytes), pointers as addresses
    trace: list = field(default_factory=list)
    allocations: int = 0
    #: where in vmem each allocation from the array module was asked for (as ``allocations`` counts them)
    allocated_at: list = field(default_factory=list)
    #: allocations from CuPy's default pool while the current stream captured (memory a graph keeps using
    #: that the pool may hand to other work once freed), and timing events recorded under capture
    capture_pool_allocations: list = field(default_factory=list)
    capture_timing_events: int = 0
    graph_launches: int = 0

    def implicit(self, kind: str) -> None:
        self.implicit_reads.append((kind, _caller()))

    def call(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def upload(self) -> None:
        self.uploads.append(_caller())


def _caller() -> str:
    """Where in vmem (outside the stand-in and NumPy) the current call comes from."""
    frames = [
        f for f in traceback.extract_stack()[:-2] if "/standin/" not in f.filename and "/numpy/" not in f.filename
    ]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"


COUNTERS = Counters()


def reset() -> Counters:
    """New counters (returned) for what follows."""
    global COUNTERS
    COUNTERS = Counters()
    return COUNTERS


class Region:
    """``size`` bytes of host memory standing for device (or pinned) memory, at a real address."""

    def __init__(self, size: int, kind: str):
        self.size = int(size)
        self.kind = kind
        raw = np.empty(self.size + ALIGN, np.uint8)
        start = (-raw.ctypes.data) % ALIGN
        self.buffer = raw[start : start + self.size]
        self.ptr = int(self.buffer.ctypes.data) if self.size else int(raw.ctypes.data) + start
        _REGIONS.add(self)

    def release(self) -> None:
        _REGIONS.remove(self)


class _Registry:
    """Live regions sorted by address: which one a raw pointer falls in."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.starts: list[int] = []
        self.regions: list[Region] = []

    def add(self, region: Region) -> None:
        with self.lock:
            i = bisect.bisect_left(self.starts, region.ptr)
            self.starts.insert(i, region.ptr)
            self.regions.insert(i, region)

    def remove(self, region: Region) -> None:
        with self.lock:
            for i, r in enumerate(self.regions):
                if r is region:
                    del self.regions[i], self.starts[i]
                    return

    def find(self, ptr: int, nbytes: int = 0) -> Region | None:
        with self.lock:
            i = bisect.bisect_right(self.starts, ptr) - 1
            if i < 0:
                return None
            r = self.regions[i]
            return r if ptr + nbytes <= r.ptr + max(r.size, 1) and ptr >= r.ptr else None


_REGIONS = _Registry()


def device_region(ptr: int, nbytes: int, what: str) -> Region:
    """The device region holding ``[ptr, ptr + nbytes)``; a CUDA error (as the GPU's illegal address) if
    none does."""
    from .cuda.runtime import CUDARuntimeError

    region = _REGIONS.find(ptr, nbytes)
    if region is None or region.kind != "device":
        raise CUDARuntimeError(f"cudaErrorIllegalAddress: {what}: {nbytes} bytes at {ptr:#x} are not device memory")
    return region


def pinned(ptr: int, nbytes: int) -> bool:
    """Whether ``[ptr, ptr + nbytes)`` lies in pinned host memory (``cudaHostAlloc``)."""
    region = _REGIONS.find(ptr, nbytes)
    return region is not None and region.kind == "pinned"


def host_side(ptr: int, nbytes: int, what: str) -> None:
    """A CUDA error where ``[ptr, ptr + nbytes)`` is device memory (a copy's host side)."""
    from .cuda.runtime import CUDARuntimeError

    region = _REGIONS.find(ptr, nbytes)
    if region is not None and region.kind == "device":
        raise CUDARuntimeError(f"cudaErrorInvalidValue: {what}: {ptr:#x} is device memory, not host memory")


# -- stream capture (CUDA graphs) ------------------------------------------------------------------------
class Capture:
    """One stream capture: the work recorded (not run) in order, the streams it has drawn in, and for each a
    vector clock of what it is known to follow (the streams' work counts), from which ``end_capture`` tells
    whether every stream forked into the capture was joined back into its origin (CUDA's rule)."""

    def __init__(self, origin: object):
        self.origin = origin
        self.ops: list = []  # (work, trace entry or None)
        self.trace: list = []
        self.count: dict = {origin: 0}
        self.clock: dict = {origin: {}}
        self.invalidated: str | None = None
        self.ended = False

    def add(self, stream: object, work: object, entry: object) -> None:
        self.ops.append(work)
        if entry is not None:
            self.trace.append(entry)
        self.count[stream] = self.count.get(stream, 0) + 1


def capture_of(stream: object) -> Capture | None:
    """The capture ``stream`` takes part in, if any."""
    return getattr(stream, "_capture", None)


def current_capture() -> Capture | None:
    from .cuda.stream import get_current_stream

    return capture_of(get_current_stream())


def submit(stream: object, work, entry: object = None) -> None:
    """Run ``work`` now, or record it where ``stream`` captures (with its trace entry)."""
    if entry is not None:
        COUNTERS.trace.append(entry)
    cap = capture_of(stream)
    if cap is None:
        work()
        return
    cap.add(stream, work, entry)


def submit_current(work, entry: object = None) -> None:
    from .cuda.stream import get_current_stream

    submit(get_current_stream(), work, entry)


def refuse_in_capture(what: str, error: str = "cudaErrorStreamCaptureUnsupported") -> None:
    """A CUDA error where the current stream captures: ``what`` is not allowed there (a synchronization, a
    copy from pageable host memory); the capture is invalidated, as CUDA invalidates it."""
    cap = current_capture()
    if cap is not None:
        _refuse(cap, f"{error}: {what} while the stream captures (at {_caller()})")


def _refuse(cap: Capture, message: str) -> None:
    from .cuda.runtime import CUDARuntimeError

    if cap.invalidated is None:
        cap.invalidated = message
    raise CUDARuntimeError(message)
