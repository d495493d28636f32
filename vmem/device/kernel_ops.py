"""The layers' array work on a device whose array module is not NumPy (a GPU's CuPy), with vmem's own
kernels where an array-module call would copy or take many passes: ReLU forward and backward run in one pass
of vmem/csrc/kernels.cuh, in place on the same buffer (CuPy copies an input that overlaps its output, and its
backward makes a mask temporary); max pooling writes the maximum and its packed window position in one pass
and scatters the gradient in one (the array-module way is about a dozen kernels); in fp32, fp16 and bf16.
On a GPU, a linear layer over fp16/bf16 maps multiplies on cuBLAS with FP32 accumulation
(:mod:`vmem.device.cuda.blas`): its FP32 weights read through a half copy at the start of the op's workspace
(as a convolution's), its weights' gradient written in FP32 straight from the half operands, its bias's
summed in FP32 by vmem's column kernels, the bias added by vmem's kernel (:func:`linear_copies` sizes what
the workspace holds). Anything else as :class:`~vmem.nn.ops.ArrayOps`.

On the CPU the same class runs the kernels' CPU build (``KernelOps(numpy)``), which is how the tests hold
it to the NumPy path bit for bit.
"""

from __future__ import annotations

from typing import Any, TYPE_CHECKING

import numpy as np

from ..codecs import native
from ..nn.ops import ArrayOps
from .carve import aligned_bytes, carve

if TYPE_CHECKING:
    from numpy.typing import DTypeLike

    from .._typing import Array
    from ..graph.program import Program

__all__ = ["KernelOps", "linear_copies", "with_linear_copies"]

_KERNEL_TYPES = ("float32", "float16", "bfloat16")
_HALF = ("float16", "bfloat16")


def linear_copies(pass_: str, dtype: DTypeLike, w_shape: tuple[int, ...], bias: int) -> int:
    """Workspace bytes a linear layer over ``dtype`` maps takes on a GPU for its copies (none in FP32): the
    weights' half copy; backward also the FP32 partial sums of the bias's gradient."""
    if np.dtype(dtype).name not in _HALF:
        return 0
    w = aligned_bytes(tuple(w_shape), np.dtype(dtype).itemsize)
    partial = aligned_bytes((native.COLUMN_GROUPS * bias,), 4) if bias else 0
    return w if pass_ == "forward" else w + partial


def with_linear_copies(program: Program) -> Program:
    """``program`` whose linear layers computing over fp16/bf16 maps (not staged) hold their copies
    (:func:`linear_copies`) in every pass's workspace."""
    import dataclasses

    ops = []
    for op in program.ops:
        if op.kind == "linear" and not op.staged and np.dtype(op.dtype).name in _HALF:
            w_shape = op.params["weight"].shape
            bias = op.params["bias"].shape[0] if "bias" in op.params else 0
            ws = {
                p: {a: n + linear_copies(p, op.dtype, w_shape, bias) for a, n in by_algo.items()}
                for p, by_algo in op.workspace.items()
            }
            op = dataclasses.replace(op, workspace=ws)
        ops.append(op)
    return dataclasses.replace(program, ops=ops)


def _backend(*arrays: Array) -> Any:
    """The kernels' backend of ``arrays`` where each is contiguous, of one size and of a type they take."""
    first = arrays[-1]
    if any(np.dtype(a.dtype).name not in _KERNEL_TYPES or a.dtype != first.dtype for a in arrays):
        return None
    if any(a.size != first.size or not a.flags.c_contiguous for a in arrays):
        return None
    return native.backend(first)


class KernelOps(ArrayOps):
    """:class:`~vmem.nn.ops.ArrayOps` with ReLU and max pooling through vmem's kernels, and half-precision
    linear layers on cuBLAS (see the module docstring)."""

    def _half_gemm(self, x: Array, w: Array) -> native.Backend | None:
        """The kernels' backend where a linear layer over ``x`` with FP32 weights ``w`` multiplies on cuBLAS in
        half (a GPU's arrays, half and contiguous), else None."""
        if getattr(self.xp, "__name__", "") != "cupy" or np.dtype(x.dtype).name not in _HALF:
            return None
        return native.backend(x) if np.dtype(w.dtype) == np.float32 and x.flags.c_contiguous else None

    def linear(self, x: Array, w: Array, b: Array | None, y: Array, workspace: Array | None = None) -> None:
        on = self._half_gemm(x, w)
        if on is None or y.dtype != x.dtype or not y.flags.c_contiguous:
            return super().linear(x, w, b, y, workspace)
        from .cuda import blas

        (wh,), _ = carve(workspace, x.dtype, tuple(w.shape))
        wh[...] = w
        y2 = y.reshape(-1, y.shape[-1])
        blas.gemm(x.reshape(-1, x.shape[-1]), wh, y2, trans_b=True)
        if b is not None:
            native.bias_add(y2, b, on)

    def linear_backward(
        self,
        dy: Array,
        x: Array,
        w: Array,
        dx: Array | None,
        dw: Array,
        db: Array | None,
        workspace: Array | None = None,
    ) -> None:
        on = self._half_gemm(dy, w)
        fits = x.dtype == dy.dtype and x.flags.c_contiguous and np.dtype(dw.dtype) == np.float32
        if on is None or not fits or (dx is not None and dx.dtype != dy.dtype):
            return super().linear_backward(dy, x, w, dx, dw, db, workspace)
        from .cuda import blas

        (wh,), rest = carve(workspace, dy.dtype, tuple(w.shape))
        blas.gemm(dy, x, dw, trans_a=True)  # the weights' gradient in FP32 from the half operands
        if db is not None:  # the bias's in FP32 from the half map, through partial sums after the copy
            (partial,), _ = carve(rest, np.float32, (native.COLUMN_GROUPS * db.shape[0],))
            native.column_sum(dy, db, partial, on)
        if dx is not None:
            wh[...] = w
            blas.gemm(dy, wh, dx)

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
