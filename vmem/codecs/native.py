"""The kernels of vmem/csrc/kernels.cuh behind one interface: their CPU build (``vmem._native``, compiled by
cffi at install) or their GPU build (:mod:`vmem.device.cuda.kernels`, registered when a CUDA device is made).

``available()`` says whether the CPU build loaded; without a C compiler at install time the codecs use
their NumPy reference implementations and vmem warns once. Each wrapper below takes ``on``, the
:class:`Backend` its arrays live on (``backend(x)`` finds it: the CPU for NumPy arrays, the GPU for CuPy
arrays), and runs the same launches on either: the CPU launcher runs a kernel's grid the way the GPU would
(one thread per byte, value, 32-value group or 256-value row), split into one range of threads per core
(cffi releases the GIL during each call, so the ranges run in parallel); on the GPU the launches go to
the current stream. Scalars are passed as the kernels declare them (``int64_t``, ``int``), as the GPU
needs.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from typing import Any, Callable, TYPE_CHECKING

import numpy as np

from ..threads import BUDGET, KERNELS
from .base import address, array_module

if TYPE_CHECKING:
    from .._typing import Array
    from numpy.typing import DTypeLike
    from .._typing import Xp

__all__ = [
    "available",
    "Backend",
    "CPU",
    "backend",
    "register_gpu",
    "binarize_encode",
    "binarize_decode",
    "binarize_relu_backward",
    "zvc_encode",
    "zvc_decode",
    "ssdc_encode",
    "ssdc_decode",
    "dpr_encode",
    "dpr_decode",
    "fixed_encode",
    "fixed_decode",
    "patch2_encode",
    "patch2_decode",
    "bias_add",
    "bias_relu",
    "column_sum",
    "column_groups",
    "relu",
    "relu_backward",
    "maxpool_forward",
    "maxpool_backward",
]

try:
    from .._native import ffi, lib  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - depends on the install
    ffi = lib = None

_warned = False


def available() -> bool:
    global _warned
    if lib is None and not _warned:
        _warned = True
        warnings.warn(
            "vmem's native kernels are not built (no C compiler at install?): codecs use NumPy",
            RuntimeWarning,
            stacklevel=3,
        )
    return lib is not None


_PARALLEL_MIN = 1 << 16  # threads of a grid: below this, one CPU thread runs them all


def _chunks(threads: int, cols: int = 1) -> list[tuple[int, int]]:
    """Split a grid of ``threads`` (rows of ``cols`` threads, for 2-D kernels) into one range per thread
    the core budget allows (at most 8)."""
    workers = min(BUDGET.threads, 8)
    if threads * cols < _PARALLEL_MIN or workers == 1:
        return [(0, threads)]
    step = -(-threads // workers)
    return [(lo, min(lo + step, threads)) for lo in range(0, threads, step)]


_TYPES = {
    np.dtype(np.float32): "float *",
    np.dtype(np.uint32): "uint32_t *",
    np.dtype(np.int32): "int32_t *",
    np.dtype(np.uint16): "uint16_t *",
    np.dtype(np.uint8): "uint8_t *",
    np.dtype(np.int64): "int64_t *",
    np.dtype(np.uint64): "uint64_t *",
    np.dtype(np.bool_): "uint8_t *",
}


def launch(kernel: str, threads: int, *args: Any, first: int = 0, cols: int = 1) -> None:
    """Run ``kernel`` over threads ``first`` to ``threads - 1`` (for a 2-D kernel: rows of ``cols``
    threads). NumPy arguments become pointers to their data (they must be C-contiguous and stay
    referenced by the caller); other arguments pass as they are."""
    if threads <= first:
        return
    fn = getattr(lib, f"vmem_{kernel}")
    c_args = [ffi.cast(_TYPES[a.dtype], ffi.from_buffer(a)) if isinstance(a, np.ndarray) else a for a in args]
    ranges = [(first + lo, first + hi) for lo, hi in _chunks(threads - first, cols)]
    if len(ranges) == 1:
        fn(first, threads, *c_args)
        return
    KERNELS.map(lambda r: fn(r[0], r[1], *c_args), ranges)


class Backend(ABC):
    """Where the kernels run: ``xp`` (the array module of their arrays), ``launch`` (a grid of threads:
    ``threads`` rows of ``cols``), ``scan`` (an exclusive prefix sum, one longer than its input) and
    ``split_full`` (whether fp10's whole words take their own kernel, which vectorizes on the CPU) and
    ``wide_loads`` (whether ReLU's kernels that load four values a thread pay: on a GPU; the CPU build
    vectorizes the one-value kernels itself)."""

    name = "backend"
    xp: Xp = np
    split_full = False
    wide_loads = False

    @abstractmethod
    def launch(self, kernel: str, threads: int, *args: Any, first: int = 0, cols: int = 1) -> None:
        """Run ``kernel`` over ``threads`` rows of ``cols`` threads, from row ``first``."""

    def scan(self, count: Any, dtype: DTypeLike) -> Array:
        xp = self.xp
        offset = xp.zeros(count.size + 1, dtype)
        xp.cumsum(count, dtype=dtype, out=offset[1:])
        return offset


class _Cpu(Backend):
    name = "cpu"
    split_full = True

    def launch(self, kernel: str, threads: int, *args: Any, first: int = 0, cols: int = 1) -> None:
        launch(kernel, threads, *args, first=first, cols=cols)


#: The CPU build (check :func:`available` first).
CPU = _Cpu()
_gpu: Callable[[Any], Backend] | None = None


def register_gpu(factory: Callable[[Any], Backend]) -> None:
    """Set how a GPU array finds its backend (:mod:`vmem.device.cuda.kernels` does, when imported)."""
    global _gpu
    _gpu = factory


def backend(x: Array) -> Backend | None:
    """The backend of ``x``'s array: the CPU build for NumPy arrays (None if it is not built), the GPU
    build for CuPy arrays (None if no CUDA device registered one)."""
    if isinstance(x, np.ndarray):
        return CPU if available() else None
    if _gpu is not None and array_module(x) is not np:
        return _gpu(x)
    return None


def _i64(n: int) -> np.int64:
    return np.int64(n)


def _groups(n: int, size: int) -> int:
    return -(-n // size)


def binarize_encode(v: Array, on: Backend = CPU, out: Array | None = None) -> Array:
    """The sign bits of ``v`` (float32, or 16-bit floats read as stored), bit i of byte b set where v[8b + i]
    > 0, into ``out`` (uint8, at least ceil(n / 8) long) where given."""
    bits = on.xp.empty(_groups(v.size, 8), np.uint8) if out is None else out[: _groups(v.size, 8)]
    kernel = "binarize_encode" if np.dtype(v.dtype) == np.float32 else f"binarize_encode_{_suffix(v)}"
    on.launch(kernel, bits.size, _bits(v), bits, _i64(v.size))
    return bits


def binarize_decode(bits: Array, out: Array, on: Backend = CPU) -> None:
    on.launch("binarize_decode", out.size, bits, out, _i64(out.size))


def binarize_relu_backward(bits: Array, dy: Array, dx: Array, on: Backend = CPU) -> None:
    """``dx = dy * mask`` from a binarized ReLU output's bits, float32 or 16-bit (their bits), ``dx`` may be
    ``dy``: the same bytes as ``dy * (y > 0)`` on the dense output."""
    if np.dtype(dx.dtype) == np.float32:
        on.launch("binarize_relu_backward", dx.size, bits, dy, dx, _i64(dx.size))
        return
    on.launch(f"binarize_relu_backward_{_suffix(dx)}", dx.size, bits, _bits(dy), _bits(dx), _i64(dx.size))


def zvc_encode(v: Array, on: Backend = CPU) -> tuple[Any, Any]:
    """Three launches: mask and count per 32 values; an exclusive scan; pack. (The size of the result
    is read back between them: on a GPU that waits for the stream.)"""
    xp = on.xp
    groups = _groups(v.size, 32)
    mask = xp.empty(groups, np.uint32)
    count = xp.empty(groups, np.uint32)
    bits = v.view(np.uint32)
    on.launch("zvc_mask", groups, bits, mask, count, _i64(v.size))
    offset = on.scan(count, np.int64)
    values = xp.empty(offset[-1].item(), np.uint32)  # the one read of the encoding: its size
    on.launch("zvc_pack", groups, bits, mask, offset, values, _i64(v.size))
    return mask, values.view(np.float32)


def zvc_decode(mask: Array, values: Array, out: Array, on: Backend = CPU) -> None:
    xp = on.xp
    count = xp.empty(mask.size, np.uint32)
    on.launch("zvc_count", mask.size, mask, count, _i64(mask.size))
    offset = on.scan(count, np.int64)
    vals = xp.ascontiguousarray(values).view(np.uint32)
    on.launch("zvc_unpack", mask.size, mask, offset, vals, out.view(np.uint32), _i64(out.size))


def ssdc_encode(v: Array, row: int, on: Backend = CPU) -> tuple[Any, Any, Any]:
    xp = on.xp
    rows = _groups(v.size, row)
    bits = v.view(np.uint32)
    count = xp.empty(rows, np.int32)
    on.launch("ssdc_count", rows, bits, count, _i64(v.size))
    row_ptr = on.scan(count, np.int32)
    nnz = row_ptr[-1].item()  # the one read of the encoding: its size
    cols = xp.empty(nnz, np.uint8)
    values = xp.empty(nnz, np.uint32)
    on.launch("ssdc_pack", rows, bits, row_ptr, cols, values, _i64(v.size))
    return row_ptr, cols, values.view(np.float32)


def ssdc_decode(row_ptr: Array, cols: Array, values: Array, out: Array, on: Backend = CPU) -> None:
    xp = on.xp
    c = xp.ascontiguousarray(cols)
    vals = xp.ascontiguousarray(values).view(np.uint32)
    on.launch("ssdc_unpack", row_ptr.size - 1, row_ptr, c, vals, out.view(np.uint32), _i64(out.size))


def dpr_encode(v: Array, fmt: str, on: Backend = CPU) -> Array:
    xp = on.xp
    bits = v.view(np.uint32)
    n = _i64(v.size)
    if fmt == "fp16":
        codes = xp.empty(v.size, np.uint16)
        on.launch("dpr16_encode", v.size, bits, codes, n)
    elif fmt == "fp8":
        codes = xp.empty(v.size, np.uint8)
        on.launch("dpr8_encode", v.size, bits, codes, n)
    elif on.split_full:
        codes = xp.empty(_groups(v.size, 3), np.uint32)
        full = max(v.size - 2 * codes.size, 0)  # words whose three values exist, then the last one or two
        on.launch("dpr10_encode_full", full, bits, codes, n)
        on.launch("dpr10_encode", codes.size, bits, codes, n, first=full)
    else:
        codes = xp.empty(_groups(v.size, 3), np.uint32)
        on.launch("dpr10_encode", codes.size, bits, codes, n)
    return codes


def dpr_decode(codes: Array, fmt: str, out: Array, on: Backend = CPU) -> None:
    c = on.xp.ascontiguousarray(codes)
    bits = out.view(np.uint32)
    n = _i64(out.size)
    if fmt == "fp10":
        words = _groups(out.size, 3)
        if on.split_full:  # the words whose three values exist, then the last one or two
            full = max(out.size - 2 * words, 0)
            on.launch("dpr10_decode_full", full, c, bits, n)
            on.launch("dpr10_decode", words, c, bits, n, first=full)
        else:
            on.launch("dpr10_decode", words, c, bits, n)
        return
    on.launch({"fp16": "dpr16_decode", "fp8": "dpr8_decode"}[fmt], out.size, c, bits, n)


def fixed_encode(v: np.ndarray, lo: np.ndarray, scale: np.ndarray, inner: int, bits: int) -> np.ndarray:
    per = 8 // bits
    codes = np.empty(_groups(v.size, per), np.uint8)
    if inner == 1 and lo.size % per == 0 and v.size:  # channels last, whole bytes per row: the 2-D kernel
        rows = v.size // lo.size
        launch(f"fixed{bits}_encode_rows", rows, v, lo, scale, codes, rows, lo.size, cols=lo.size // per)
    else:
        launch("fixed_encode", codes.size, v, lo, scale, codes, v.size, inner, lo.size, bits)
    return codes


def fixed_decode(codes: np.ndarray, lo: np.ndarray, scale: np.ndarray, inner: int, bits: int, out: np.ndarray) -> None:
    per = 8 // bits
    c = np.ascontiguousarray(codes)
    if inner == 1 and lo.size % per == 0 and out.size:
        rows = out.size // lo.size
        launch(f"fixed{bits}_decode_rows", rows, c, lo, scale, out, rows, lo.size, cols=lo.size // per)
    else:
        launch("fixed_decode", out.size, c, lo, scale, out, out.size, inner, lo.size, bits)


def patch2_encode(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Codes, lo and scale of each 4x4 patch of a C-contiguous (N, H, W, C) float32 array."""
    n, h, w, c = x.shape
    patches = n * _groups(h, 4) * _groups(w, 4)
    codes, lo, scale = (
        np.empty(patches * c, np.uint32),
        np.empty(patches * c, np.float32),
        np.empty(patches * c, np.float32),
    )
    launch("patch2_encode", patches, x, codes, lo, scale, n, h, w, c, cols=c)
    return codes, lo, scale


def patch2_decode(codes: np.ndarray, lo: np.ndarray, scale: np.ndarray, out: np.ndarray) -> None:
    n, h, w, c = out.shape
    launch(
        "patch2_decode",
        n * h * w,
        np.ascontiguousarray(codes),
        np.ascontiguousarray(lo),
        np.ascontiguousarray(scale),
        out,
        n,
        h,
        w,
        c,
        cols=c,
    )


# -- the layers' element-wise kernels: in place, in fp32, fp16 and bf16 -----------------------------------
def _suffix(a: Array) -> str:
    """The kernels' name for ``a``'s dtype: f32, f16 or bf16 (half-precision arrays go as their bits)."""
    name = np.dtype(a.dtype).name
    if name in ("float32", "float16", "bfloat16"):
        return {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}[name]
    raise TypeError(f"the layers' kernels take float32, float16 or bfloat16 arrays, not {name}")


def _bits(a: Array) -> Array:
    return a if np.dtype(a.dtype) == np.float32 else a.view(np.uint16)


def bias_add(y: Array, b: Array, on: Backend = CPU) -> None:
    """``y += b`` in place over a channels-last ``y`` (..., C) with an FP32 bias of C values, computed in FP32
    and rounded once to ``y``'s type."""
    c = y.shape[-1]
    rows = y.size // c if c else 0
    on.launch(f"bias_add_{_suffix(y)}", rows, _bits(y), b, _i64(rows), _i64(c), cols=c)


def bias_relu(y: Array, b: Array, on: Backend = CPU) -> None:
    """``y = max(y + b, 0)`` in place over a channels-last ``y`` (..., C) with an FP32 bias of C values."""
    c = y.shape[-1]
    rows = y.size // c if c else 0
    on.launch(f"bias_relu_{_suffix(y)}", rows, _bits(y), b, _i64(rows), _i64(c), cols=c)


#: The most row groups :func:`column_sum` cuts a map into (its partial sums: groups x channels FP32 values).
COLUMN_GROUPS = 1024


def column_groups(rows: int) -> tuple[int, int]:
    """(groups, rows per group) of :func:`column_sum` over ``rows`` rows: at most :data:`COLUMN_GROUPS`
    groups of equal size, the last shorter."""
    per = max(1, -(-rows // COLUMN_GROUPS))
    return -(-rows // per) if rows else 0, per


def column_sum(x: Array, out: Array, partial: Array, on: Backend = CPU) -> None:
    """``out`` (FP32, C values) = the sum over the rows of a channels-last ``x`` (..., C) in fp32, fp16 or
    bf16, accumulated in FP32 in a fixed order: each group of rows (:func:`column_groups`) in row order
    into ``partial`` (FP32, at least groups x C values), then the groups in order. Both builds give the
    same bytes."""
    c = x.shape[-1]
    rows = x.size // c if c else 0
    groups, per = column_groups(rows)
    if groups == 0:
        out[...] = 0
        return
    part = partial.reshape(-1)[: groups * c]
    on.launch(f"column_partial_{_suffix(x)}", groups, _bits(x), part, _i64(rows), _i64(c), _i64(per), cols=c)
    on.launch("column_finish", c, part, out, _i64(groups), _i64(c))


def _groups_of_four(on: Backend, *arrays: Array) -> int:
    """How many whole groups of four values the four-a-thread kernels take: where the backend has wide
    loads and every array starts aligned to four of its values (16 bytes of float32, 8 of half), else none."""
    if not on.wide_loads or arrays[0].size < 4:
        return 0
    align = 4 * np.dtype(arrays[0].dtype).itemsize
    return arrays[0].size // 4 if all(address(a) % align == 0 for a in arrays) else 0


def _flat(a: Array, start: int) -> Array:
    return _bits(a).reshape(-1)[start:]


def relu(x: Array, y: Array, on: Backend = CPU) -> None:
    """``y = max(x, 0)`` (NaN passes, -0 becomes +0); ``y`` may be ``x``. On a GPU four values a thread
    where the arrays are aligned, the rest one a thread."""
    groups, n = _groups_of_four(on, x, y), y.size
    if groups:
        on.launch(f"relu4_{_suffix(y)}", groups, _bits(x), _bits(y), _i64(groups))
    if n > 4 * groups:
        rest = n - 4 * groups
        on.launch(f"relu_{_suffix(y)}", rest, _flat(x, 4 * groups), _flat(y, 4 * groups), _i64(rest))


def relu_backward(y: Array, dy: Array, dx: Array, on: Backend = CPU) -> None:
    """``dx = dy * (y > 0)``; ``dx`` may be ``dy`` (in place on the shared gradient buffer). On a GPU four
    values a thread where the arrays are aligned, the rest one a thread."""
    groups, n, kind = _groups_of_four(on, y, dy, dx), dx.size, _suffix(dy)
    if groups:
        on.launch(f"relu_backward4_{kind}", groups, _bits(y), _bits(dy), _bits(dx), _i64(groups))
    if n > 4 * groups:
        rest, at = n - 4 * groups, 4 * groups
        on.launch(f"relu_backward_{kind}", rest, _flat(y, at), _flat(dy, at), _flat(dx, at), _i64(rest))


def _pool_args(x_shape: tuple, y_shape: tuple, kernel: tuple, stride: tuple) -> tuple:
    n, h, w, c = x_shape
    _, ho, wo, _ = y_shape
    return (
        _i64(n),
        _i64(h),
        _i64(w),
        _i64(c),
        _i64(ho),
        _i64(wo),
        int(kernel[0]),
        int(kernel[1]),
        int(stride[0]),
        int(stride[1]),
    )


def maxpool_forward(
    x: Array, y: Array, arg: Any, kernel: tuple, stride: tuple, on: Backend = CPU, packed: bool = False
) -> None:
    """Max pooling of a channels-last ``x`` (N, H, W, C) into ``y`` and the window position of each maximum
    into ``arg`` (uint8: ``y``'s shape, or with ``packed`` 4 bits per output, two to a byte, the even one
    low), in one pass; no padding, every window inside ``x``."""
    n, h, w, _ = x.shape
    _, ho, wo, _ = y.shape
    if (ho - 1) * int(stride[0]) + int(kernel[0]) > h or (wo - 1) * int(stride[1]) + int(kernel[1]) > w:
        raise ValueError(f"maxpool_forward: windows {tuple(kernel)} at stride {tuple(stride)} leave {x.shape}")
    if packed and kernel[0] * kernel[1] > 16:
        raise ValueError(f"maxpool_forward: a {tuple(kernel)} window's positions do not fit 4 bits")
    threads = -(-y.size // 2) if packed else y.size
    args = _pool_args(x.shape, y.shape, kernel, stride)
    on.launch(f"maxpool_forward_{_suffix(x)}", threads, _bits(x), _bits(y), arg, *args, int(packed))


def maxpool_backward(
    dy: Array,
    arg: Any,
    dx: Array,
    kernel: tuple,
    stride: tuple,
    on: Backend = CPU,
    packed: bool = False,
    relu: Array | None = None,
) -> None:
    """``dx`` (N, H, W, C) from ``dy`` and the argmax map (as :func:`maxpool_forward` wrote it), in one
    pass, for windows that do not overlap. With ``relu`` (the output of the ReLU the pool read, ``dx``'s
    shape and dtype), ReLU's backward in the same pass: ``dx`` as :func:`relu_backward` would make it from
    the pool's gradient."""
    if any(int(s) < int(k) for s, k in zip(stride, kernel)):
        raise ValueError(f"maxpool_backward: windows {tuple(kernel)} overlap at stride {tuple(stride)}")
    args = _pool_args(dx.shape, dy.shape, kernel, stride)
    if relu is not None:
        if relu.shape != dx.shape or relu.dtype != dx.dtype:
            raise ValueError(f"maxpool_backward: the ReLU's output {relu.shape} {relu.dtype} is not dx's")
        on.launch(
            f"maxpool_relu_backward_{_suffix(dy)}", dx.size, _bits(dy), arg, _bits(relu), _bits(dx), *args, int(packed)
        )
        return
    kind = "f32" if _suffix(dy) == "f32" else "16"  # half values move as their bits: one kernel for both
    on.launch(f"maxpool_backward_{kind}", dx.size, _bits(dy), arg, _bits(dx), *args, int(packed))
