"""The layers' array work on a device whose array module is not NumPy (a GPU's CuPy), with vmem's own
kernels where an array-module call would copy or take many passes: ReLU forward and backward run in one pass
of vmem/csrc/kernels.cuh, in place on the same buffer (CuPy copies an input that overlaps its output, and its
backward makes a mask temporary); max pooling writes the maximum and its packed window position in one pass
and scatters the gradient in one (the array-module way is about a dozen kernels); in fp32, fp16 and bf16;
anything else as :class:`~vmem.nn.ops.ArrayOps`.

On the CPU the same class runs the kernels' CPU build (``KernelOps(numpy)``), which is how the tests hold
it to the NumPy path bit for bit.
"""

from __future__ import annotations

from typing import Any, TYPE_CHECKING

import numpy as np

from ..codecs import native
from ..nn.ops import ArrayOps

if TYPE_CHECKING:
    from .._typing import Array

__all__ = ["KernelOps"]

_KERNEL_TYPES = ("float32", "float16", "bfloat16")


def _backend(*arrays: Array) -> Any:
    """The kernels' backend of ``arrays`` where each is contiguous, of one size and of a type they take."""
    first = arrays[-1]
    if any(np.dtype(a.dtype).name not in _KERNEL_TYPES or a.dtype != first.dtype for a in arrays):
        return None
    if any(a.size != first.size or not a.flags.c_contiguous for a in arrays):
        return None
    return native.backend(first)


class KernelOps(ArrayOps):
    """:class:`~vmem.nn.ops.ArrayOps` with ReLU and max pooling through vmem's kernels (see the module
    docstring)."""

    def relu(self, x: Array, y: Array) -> None:
        on = _backend(x, y)
        if on is None:
            return super().relu(x, y)
        native.relu(x, y, on)

    def relu_backward(self, y: Array, dy: Array, dx: Array) -> None:
        on = _backend(y, dy, dx)
        if on is None:
            return super().relu_backward(y, dy, dx)
        native.relu_backward(y, dy, dx, on)

    def maxpool_forward(self, x: Array, y: Array, arg: Any, kernel: tuple, stride: tuple, packed: bool) -> bool:
        on = _backend(x) if y.dtype == x.dtype and y.flags.c_contiguous and arg.flags.c_contiguous else None
        if on is None:
            return False
        native.maxpool_forward(x, y, arg, kernel, stride, on, packed=packed)
        return True

    def maxpool_backward(
        self, dy: Array, arg: Any, dx: Array, kernel: tuple, stride: tuple, packed: bool, relu: Array | None = None
    ) -> bool:
        ok = dx.dtype == dy.dtype and dy.flags.c_contiguous and arg.flags.c_contiguous
        if relu is not None:
            ok = ok and relu.dtype == dx.dtype and relu.shape == dx.shape and relu.flags.c_contiguous
        on = _backend(dx) if ok else None
        if on is None:
            return False
        native.maxpool_backward(dy, arg, dx, kernel, stride, on, packed=packed, relu=relu)
        return True
