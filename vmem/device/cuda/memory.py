"""Memory of the CUDA device: one device arena, an exact-size pinned arena, CuPy's temporaries in the pool.

- :class:`DeviceArena`: a single raw ``cudaMalloc`` (``cupy.cuda.Memory``, outside CuPy's pool) that the
  :class:`~vmem.pool.DevicePool` carves; arrays are CuPy views at offsets (aligned by the pool).
- :class:`PinnedArena`: ``cudaHostAlloc`` of exactly the asked size (``cupy.cuda.PinnedMemory``, not CuPy's
  power-of-two pinned pool), viewed as NumPy arrays, for the :class:`~vmem.pool.PinnedHostPool`.
- :class:`PoolAllocator`: CuPy's allocator hook routed through the device pool (category ``other``), so
  the temporaries of CuPy's element-wise kernels and reductions are allocated in the arena and counted,
  and freed in stream order when CuPy drops them.
"""

from __future__ import annotations

from typing import Any, TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ..._typing import Array, ShapeLike
    import cupy

    from numpy.typing import DTypeLike

__all__ = ["DeviceArena", "PinnedArena", "PoolAllocator"]


class DeviceArena:
    """``capacity`` bytes of device memory in one allocation."""

    def __init__(self, capacity: int):
        import cupy

        self.capacity = capacity
        self.memory = cupy.cuda.Memory(capacity)
        self.base = cupy.cuda.MemoryPointer(self.memory, 0)
        self.ptr = int(self.base.ptr)

    def view(self, offset: int, shape: ShapeLike, dtype: DTypeLike) -> Array:
        import cupy

        if self.base is None:
            raise RuntimeError("the device arena was released (its device is closed)")
        return cupy.ndarray(shape, dtype, memptr=self.base + offset)

    def release(self) -> None:
        """Drop the arena's own hold on its memory: the driver gets it back once no view of it is left (a
        closed device's next user may take the GPU's free memory again)."""
        self.memory = self.base = None

    def fill(self, offset: int, nbytes: int, byte: int, stream: cupy.cuda.Stream | None = None) -> None:
        """Set ``nbytes`` bytes at ``offset`` to ``byte`` on ``stream`` (poisoning freed blocks)."""
        import cupy

        ptr = stream.ptr if stream is not None else cupy.cuda.get_current_stream().ptr
        cupy.cuda.runtime.memsetAsync(self.ptr + offset, byte, nbytes, ptr)

    def __repr__(self) -> str:
        return f"DeviceArena({self.capacity} bytes at {self.ptr:#x})"


class PinnedArena:
    """``capacity`` bytes of pinned (page-locked) host memory, prefaulted by the driver."""

    def __init__(self, capacity: int):
        import cupy

        self.capacity = capacity
        self.memory = cupy.cuda.PinnedMemory(capacity)
        self.ptr = int(self.memory.ptr)
        self.buffer = np.frombuffer(cupy.cuda.PinnedMemoryPointer(self.memory, 0), np.uint8, capacity)

    def view(self, offset: int, shape: ShapeLike, dtype: DTypeLike) -> np.ndarray:
        return np.ndarray(shape, dtype=dtype, buffer=self.buffer, offset=offset)

    def __repr__(self) -> str:
        return f"PinnedArena({self.capacity} bytes at {self.ptr:#x})"


class PoolAllocator:
    """``malloc``/``free`` for ``cupy.cuda.PythonFunctionAllocator`` over the device pool.

    CuPy calls ``free`` when the last Python reference to a temporary dies, on the host, while kernels
    that use it may still run: the block is freed in stream order on the current stream."""

    def __init__(self, pool: Any, arena: DeviceArena, stream_of: Any):
        self.pool = pool
        self.arena = arena
        self.stream_of = stream_of  # cupy stream pointer -> vmem stream (or None)
        self.blocks: dict[int, Any] = {}

    def malloc(self, size: int, device_id: int) -> int:
        from ...errors import OutOfDeviceMemory

        stream = self._current()
        try:
            block = self.pool.allocate(max(size, 1), stream, "other")
        except OutOfDeviceMemory as exc:
            import cupy

            raise cupy.cuda.memory.OutOfMemoryError(size, exc.capacity, exc.capacity) from exc
        ptr = self.arena.ptr + block.offset
        self.blocks[ptr] = block
        return ptr

    def free(self, ptr: int, device_id: int) -> None:
        block = self.blocks.pop(ptr, None)
        if block is not None:
            self.pool.free(block, self._current())

    def _current(self) -> Any:
        import cupy

        return self.stream_of(cupy.cuda.get_current_stream().ptr)
