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


def host_side(ptr: int, nbytes: int, what: str) -> None:
    """A CUDA error where ``[ptr, ptr + nbytes)`` is device memory (a copy's host side)."""
    from .cuda.runtime import CUDARuntimeError

    region = _REGIONS.find(ptr, nbytes)
    if region is not None and region.kind == "device":
        raise CUDARuntimeError(f"cudaErrorInvalidValue: {what}: {ptr:#x} is device memory, not host memory")
