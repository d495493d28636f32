"""``cupy.cuda.memory`` on the stand-in: Memory (raw allocations), MemoryPointer, allocators, the default pool."""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable

from .. import _state


class OutOfMemoryError(MemoryError):
    def __init__(self, size: int, total: int, limit: int = 0):
        super().__init__(f"Out of memory allocating {size:,} bytes (allocated so far: {total:,} bytes).")
        self.size, self.total, self.limit = size, total, limit


class BaseMemory:
    ptr: int
    size: int
    device_id = 0

    def region(self) -> tuple[Any, int]:
        """The region this memory lies in and its offset there."""
        raise NotImplementedError


class Memory(BaseMemory):
    """``cudaMalloc`` of ``size`` bytes: its own region, given back when the object dies."""

    def __init__(self, size: int):
        self.size = int(size)
        self._region = _state.Region(self.size, "device")
        self.ptr = self._region.ptr
        _state.COUNTERS.allocations += 1

    def region(self) -> tuple[Any, int]:
        return self._region, 0

    def __del__(self) -> None:
        region = getattr(self, "_region", None)
        if region is not None:
            region.release()


class UnownedMemory(BaseMemory):
    """Memory at ``ptr`` inside another allocation (what an allocator hands out), freed by ``on_free``."""

    def __init__(self, ptr: int, size: int, owner: Any = None, on_free: Callable[[], None] | None = None):
        self.ptr, self.size, self.owner = int(ptr), int(size), owner
        self._region = _state.device_region(self.ptr, self.size, "an allocator's pointer")
        self._on_free = on_free

    def region(self) -> tuple[Any, int]:
        return self._region, self.ptr - self._region.ptr

    def __del__(self) -> None:
        if self._on_free is not None:
            self._on_free()


class MemoryPointer:
    """A pointer into device memory: ``mem`` and ``ptr``; ``+ offset`` makes another."""

    def __init__(self, mem: BaseMemory, offset: int):
        self.mem = mem
        self.ptr = mem.ptr + int(offset)
        self.device_id = 0

    def __add__(self, offset: int) -> "MemoryPointer":
        if not isinstance(offset, int):
            raise TypeError(f"a MemoryPointer moves by an int, not {type(offset).__name__}")
        return MemoryPointer(self.mem, self.ptr - self.mem.ptr + offset)

    def __int__(self) -> int:
        return self.ptr

    def buffer(self) -> tuple[Any, int]:
        region, base = self.mem.region()
        return region.buffer, base + self.ptr - self.mem.ptr


class MemoryPool:
    """CuPy's default pool, counted: what arrays made without an allocator of their own take."""

    def __init__(self) -> None:
        self._used = 0
        self._lock = threading.Lock()

    def malloc(self, size: int) -> MemoryPointer:
        mem = _PoolMemory(max(int(size), 1), self)
        return MemoryPointer(mem, 0)

    def used_bytes(self) -> int:
        return self._used

    def total_bytes(self) -> int:
        return self._used

    def free_all_blocks(self, stream: Any = None) -> None:
        pass


class _PoolMemory(Memory):
    def __init__(self, size: int, pool: MemoryPool):
        super().__init__(size)
        self.pool = pool
        with pool._lock:
            pool._used += size

    def __del__(self) -> None:
        with self.pool._lock:
            self.pool._used -= self.size
        super().__del__()


_POOL = MemoryPool()
_local = threading.local()
_global: list = [None]


class PythonFunctionAllocator:
    """``malloc(size, device_id) -> int`` and ``free(ptr, device_id)`` as CuPy's allocator: ``self.malloc``
    is what ``using_allocator`` takes."""

    def __init__(self, malloc_func: Callable[[int, int], int], free_func: Callable[[int, int], None]):
        self._malloc, self._free = malloc_func, free_func

    def malloc(self, size: int) -> MemoryPointer:
        ptr = self._malloc(int(size), 0)
        free = self._free
        mem = UnownedMemory(ptr, size, self, lambda: free(ptr, 0))
        return MemoryPointer(mem, 0)


def get_allocator() -> Callable[[int], MemoryPointer]:
    current = getattr(_local, "allocator", None)
    return current or _global[0] or _POOL.malloc


def set_allocator(allocator: Callable[[int], MemoryPointer] | None = None) -> None:
    _global[0] = allocator


@contextlib.contextmanager
def using_allocator(allocator: Callable[[int], MemoryPointer] | None = None):
    previous = getattr(_local, "allocator", None)
    _local.allocator = allocator
    try:
        yield
    finally:
        _local.allocator = previous


def alloc(size: int) -> MemoryPointer:
    _state.COUNTERS.allocations += 1
    _state.COUNTERS.allocated_at.append(_state._caller())
    allocator = get_allocator()
    if allocator == _POOL.malloc and _state.current_capture() is not None:
        _state.COUNTERS.capture_pool_allocations.append(_state._caller())
    return allocator(int(size))


def get_default_memory_pool() -> MemoryPool:
    return _POOL
