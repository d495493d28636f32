"""The CPU build of native/kernels.cuh (``vmem._native``, compiled by cffi at install), or nothing.

``available()`` says whether it loaded; without a C compiler at install time the codecs use their NumPy
reference implementations and vmem warns once. Each wrapper launches a kernel's grid the way the GPU
would (one thread per byte, value, 32-value group or 256-value row), split into one range of threads per
core; cffi releases the GIL during each call, so the ranges run in parallel.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from ..threads import BUDGET, KERNELS

__all__ = ["available", "binarize_encode", "binarize_decode", "binarize_relu_backward", "zvc_encode",
           "zvc_decode", "ssdc_encode", "ssdc_decode", "dpr_encode", "dpr_decode", "fixed_encode", "fixed_decode",
           "patch2_encode", "patch2_decode"]

try:
    from .._native import ffi, lib  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - depends on the install
    ffi = lib = None

_warned = False


def available() -> bool:
    global _warned
    if lib is None and not _warned:
        _warned = True
        warnings.warn("vmem's native kernels are not built (no C compiler at install?): codecs use NumPy",
                      RuntimeWarning, stacklevel=3)
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


_TYPES = {np.dtype(np.float32): "float *", np.dtype(np.uint32): "uint32_t *", np.dtype(np.int32): "int32_t *",
          np.dtype(np.uint16): "uint16_t *", np.dtype(np.uint8): "uint8_t *", np.dtype(np.int64): "int64_t *"}


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


def _groups(n: int, size: int) -> int:
    return -(-n // size)


def binarize_encode(v: np.ndarray) -> np.ndarray:
    bits = np.empty(_groups(v.size, 8), np.uint8)
    launch("binarize_encode", bits.size, v, bits, v.size)
    return bits


def binarize_decode(bits: np.ndarray, out: np.ndarray) -> None:
    launch("binarize_decode", out.size, bits, out, out.size)


def binarize_relu_backward(bits: np.ndarray, dy: np.ndarray, dx: np.ndarray) -> None:
    launch("binarize_relu_backward", dx.size, bits, dy, dx, dx.size)


def _exclusive_scan(count: np.ndarray, dtype: Any) -> np.ndarray:
    offset = np.zeros(count.size + 1, dtype)
    np.cumsum(count, out=offset[1:])
    return offset


def zvc_encode(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Three launches: mask and count per 32 values; an exclusive scan (NumPy here, cupy on a GPU); pack."""
    groups = _groups(v.size, 32)
    mask = np.empty(groups, np.uint32)
    count = np.empty(groups, np.uint32)
    bits = v.view(np.uint32)
    launch("zvc_mask", groups, bits, mask, count, v.size)
    offset = _exclusive_scan(count, np.int64)
    values = np.empty(int(offset[-1]), np.uint32)
    launch("zvc_pack", groups, bits, mask, offset, values, v.size)
    return mask, values.view(np.float32)


def zvc_decode(mask: np.ndarray, values: np.ndarray, out: np.ndarray) -> None:
    count = np.empty(mask.size, np.uint32)
    launch("zvc_count", mask.size, mask, count, mask.size)
    offset = _exclusive_scan(count, np.int64)
    vals = np.ascontiguousarray(values).view(np.uint32)
    launch("zvc_unpack", mask.size, mask, offset, vals, out.view(np.uint32), out.size)


def ssdc_encode(v: np.ndarray, row: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = _groups(v.size, row)
    bits = v.view(np.uint32)
    count = np.empty(rows, np.int32)
    launch("ssdc_count", rows, bits, count, v.size)
    row_ptr = _exclusive_scan(count, np.int32)
    nnz = int(row_ptr[-1])
    cols = np.empty(nnz, np.uint8)
    values = np.empty(nnz, np.uint32)
    launch("ssdc_pack", rows, bits, row_ptr, cols, values, v.size)
    return row_ptr, cols, values.view(np.float32)


def ssdc_decode(row_ptr: np.ndarray, cols: np.ndarray, values: np.ndarray, out: np.ndarray) -> None:
    c = np.ascontiguousarray(cols)
    vals = np.ascontiguousarray(values).view(np.uint32)
    launch("ssdc_unpack", row_ptr.size - 1, row_ptr, c, vals, out.view(np.uint32), out.size)


def dpr_encode(v: np.ndarray, fmt: str) -> np.ndarray:
    bits = v.view(np.uint32)
    if fmt == "fp16":
        codes = np.empty(v.size, np.uint16)
        launch("dpr16_encode", v.size, bits, codes, v.size)
    elif fmt == "fp8":
        codes = np.empty(v.size, np.uint8)
        launch("dpr8_encode", v.size, bits, codes, v.size)
    else:
        codes = np.empty(_groups(v.size, 3), np.uint32)
        full = max(v.size - 2 * codes.size, 0)  # words whose three values exist, then the last one or two
        launch("dpr10_encode_full", full, bits, codes, v.size)
        launch("dpr10_encode", codes.size, bits, codes, v.size, first=full)
    return codes


def dpr_decode(codes: np.ndarray, fmt: str, out: np.ndarray) -> None:
    c = np.ascontiguousarray(codes)
    bits = out.view(np.uint32)
    if fmt == "fp10":  # the words whose three values exist, then the last one or two
        words = _groups(out.size, 3)
        full = max(out.size - 2 * words, 0)
        launch("dpr10_decode_full", full, c, bits, out.size)
        launch("dpr10_decode", words, c, bits, out.size, first=full)
        return
    launch({"fp16": "dpr16_decode", "fp8": "dpr8_decode"}[fmt], out.size, c, bits, out.size)


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
    codes, lo, scale = np.empty(patches * c, np.uint32), np.empty(patches * c, np.float32), \
        np.empty(patches * c, np.float32)
    launch("patch2_encode", patches, x, codes, lo, scale, n, h, w, c, cols=c)
    return codes, lo, scale


def patch2_decode(codes: np.ndarray, lo: np.ndarray, scale: np.ndarray, out: np.ndarray) -> None:
    n, h, w, c = out.shape
    launch("patch2_decode", n * h * w, np.ascontiguousarray(codes), np.ascontiguousarray(lo),
           np.ascontiguousarray(scale), out, n, h, w, c, cols=c)
