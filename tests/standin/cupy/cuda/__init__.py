"""``cupy.cuda`` on the stand-in (see ``cupy/__init__.py``)."""

from __future__ import annotations

from . import cublas, device, function, memory, nvrtc, runtime
from . import graph

__all__ = [
    "Device",
    "Event",
    "Memory",
    "MemoryPool",
    "MemoryPointer",
    "PinnedMemory",
    "PinnedMemoryPointer",
    "PythonFunctionAllocator",
    "Stream",
    "UnownedMemory",
    "alloc",
    "cublas",
    "device",
    "function",
    "graph",
    "get_allocator",
    "get_current_stream",
    "get_elapsed_time",
    "is_available",
    "memory",
    "nvrtc",
    "runtime",
    "set_allocator",
    "using_allocator",
]
from .memory import (
    MemoryPool,
    Memory,
    MemoryPointer,
    PythonFunctionAllocator,
    UnownedMemory,
    alloc,
    get_allocator,
    set_allocator,
    using_allocator,
)
from .stream import Event, Stream, get_current_stream, get_elapsed_time


class Device:
    def __init__(self, device: int | None = None):
        self.id = 0 if device is None else int(device)
        runtime._check(self.id)

    compute_capability = "90"

    def use(self) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def __enter__(self) -> "Device":
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def __int__(self) -> int:
        return self.id


def is_available() -> bool:
    return True


class PinnedMemory:
    """``cudaHostAlloc`` of ``size`` bytes: host memory at a real address (not device memory)."""

    def __init__(self, size: int):
        from .. import _state

        self.size = int(size)
        self._region = _state.Region(self.size, "pinned")
        self.ptr = self._region.ptr

    def __del__(self) -> None:
        region = getattr(self, "_region", None)
        if region is not None:
            region.release()


def PinnedMemoryPointer(mem: PinnedMemory, offset: int) -> memoryview:
    """The pinned memory from ``offset``, as a buffer NumPy can view (what the stand-in needs of it)."""
    return memoryview(mem._region.buffer[offset:])
