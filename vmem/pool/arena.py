"""Upstream memory resources: the one fixed buffer a pool carves blocks from.

A pool does offset arithmetic only; the arena maps an offset to memory. ``HostArena`` is a NumPy
buffer (the CPU device's "device memory", and the pinned host pool's buffer on the CPU). The CUDA
device supplies a cudaMalloc'd slab and cudaHostAlloc'd pinned memory; the simulator supplies none.
"""

from __future__ import annotations

from typing import Protocol, TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .._typing import Array
    from numpy.typing import DTypeLike

__all__ = ["Arena", "HostArena"]


class Arena(Protocol):
    """Backing memory of ``capacity`` bytes; ``view`` gives an array over ``[offset, offset + nbytes)``."""

    capacity: int

    def view(self, offset: int, shape: tuple[int, ...], dtype: DTypeLike) -> Array: ...


class HostArena:
    """A host buffer of ``capacity`` bytes.

    ``prefault=True`` touches every page up front, as cudaHostAlloc does when it pins memory, so that
    the first copies into the buffer do not pay for page faults.
    """

    #: the base address's alignment (a page): every pool alignment up to it holds for the arrays too
    BASE_ALIGNMENT = 4096

    def __init__(self, capacity: int, *, prefault: bool = False):
        self.capacity = capacity
        raw = np.empty(capacity + self.BASE_ALIGNMENT, dtype=np.uint8)
        skip = -raw.__array_interface__["data"][0] % self.BASE_ALIGNMENT
        self.buffer = raw[skip : skip + capacity]
        if prefault:
            self.buffer.fill(0)

    def view(self, offset: int, shape: tuple[int, ...], dtype: DTypeLike) -> np.ndarray:
        return np.ndarray(shape, dtype=dtype, buffer=self.buffer, offset=offset)

    def fill(self, offset: int, nbytes: int, byte: int) -> None:
        """Set ``nbytes`` bytes from ``offset`` to ``byte`` (used to poison freed blocks)."""
        self.buffer[offset : offset + nbytes] = byte

    def __repr__(self) -> str:
        return f"HostArena({self.capacity} bytes)"
