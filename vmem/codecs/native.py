"""The CPU build of native/kernels.cuh (``vmem._native``, compiled by cffi at install), or nothing.

``available()`` says whether it loaded; without a C compiler at install time the codecs use their NumPy
reference implementations and vmem warns once.
"""

from __future__ import annotations

import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np

__all__ = ["available", "binarize_encode", "binarize_decode", "zvc_encode", "zvc_decode", "dpr_encode",
           "dpr_decode"]

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


_PARALLEL_MIN = 1 << 20  # values: below this, one thread
_pool: ThreadPoolExecutor | None = None


def _chunks(n: int, align: int) -> list[tuple[int, int]]:
    """Split ``[0, n)`` into one aligned range per core (cffi releases the GIL during C calls)."""
    workers = min(os.cpu_count() or 1, 8)
    if n < _PARALLEL_MIN or workers == 1:
        return [(0, n)]
    step = -(-n // workers // align) * align
    return [(lo, min(lo + step, n)) for lo in range(0, n, step)]


def _run(n: int, align: int, call: Callable[[int, int], None]) -> None:
    global _pool
    ranges = _chunks(n, align)
    if len(ranges) == 1:
        call(*ranges[0])
        return
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=len(ranges), thread_name_prefix="vmem-codec")
    list(_pool.map(lambda r: call(*r), ranges))


def _ptr(a: np.ndarray, ctype: str):
    """A C pointer into ``a``. The caller must keep ``a`` (not only a view's base) alive during the call:
    pass arrays bound to local names, never temporaries."""
    return ffi.cast(ctype, ffi.from_buffer(a))


def binarize_encode(v: np.ndarray) -> np.ndarray:
    bits = np.empty(-(-v.size // 8), np.uint8)

    def call(lo: int, hi: int) -> None:
        part, dst = v[lo:hi], bits[lo // 8:]
        lib.vmem_binarize_encode(_ptr(part, "float *"), _ptr(dst, "uint8_t *"), hi - lo)

    _run(v.size, 8, call)
    return bits


def binarize_decode(bits: np.ndarray, out: np.ndarray) -> None:
    def call(lo: int, hi: int) -> None:
        src, dst = bits[lo // 8:], out[lo:hi]
        lib.vmem_binarize_decode(_ptr(src, "uint8_t *"), _ptr(dst, "float *"), hi - lo)

    _run(out.size, 8, call)


def zvc_encode(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Three launches: mask and count per 32 values; an exclusive scan (NumPy here, cupy on a GPU); pack."""
    groups = -(-v.size // 32)
    mask = np.empty(groups, np.uint32)
    count = np.empty(groups, np.uint32)
    bits = v.view(np.uint32)
    lib.vmem_zvc_mask(_ptr(bits, "uint32_t *"), _ptr(mask, "uint32_t *"), _ptr(count, "uint32_t *"), v.size)
    offset = np.zeros(groups, np.int64)
    np.cumsum(count[:-1], out=offset[1:])
    total = int(offset[-1] + count[-1]) if groups else 0
    values = np.empty(total, np.uint32)
    lib.vmem_zvc_pack(_ptr(bits, "uint32_t *"), _ptr(mask, "uint32_t *"), _ptr(offset, "int64_t *"),
                      _ptr(values, "uint32_t *"), v.size)
    return mask, values.view(np.float32)


def zvc_decode(mask: np.ndarray, values: np.ndarray, out: np.ndarray) -> None:
    count = np.unpackbits(mask.view(np.uint8)).reshape(-1, 32).sum(axis=1) if mask.size else np.zeros(0, int)
    offset = np.zeros(mask.size, np.int64)
    np.cumsum(count[:-1], out=offset[1:])
    lib.vmem_zvc_unpack(_ptr(mask, "uint32_t *"), _ptr(offset, "int64_t *"), _ptr(values.view(np.uint32), "uint32_t *"),
                        _ptr(out.view(np.uint32), "uint32_t *"), out.size)


def dpr_encode(v: np.ndarray, ebits: int, mbits: int) -> np.ndarray:
    codes = np.empty(v.size, np.uint16)
    bits = v.view(np.uint32)

    def call(lo: int, hi: int) -> None:
        src, dst = bits[lo:hi], codes[lo:hi]
        lib.vmem_dpr_encode(_ptr(src, "uint32_t *"), _ptr(dst, "uint16_t *"), hi - lo, ebits, mbits)

    _run(v.size, 1, call)
    return codes


def dpr_decode(codes: np.ndarray, ebits: int, mbits: int) -> np.ndarray:
    out = np.empty(codes.size, np.uint32)
    codes16 = np.ascontiguousarray(codes, np.uint16)  # bound to a name: it must outlive the calls

    def call(lo: int, hi: int) -> None:
        src, dst = codes16[lo:hi], out[lo:hi]
        lib.vmem_dpr_decode(_ptr(src, "uint16_t *"), _ptr(dst, "uint32_t *"), hi - lo, ebits, mbits)

    _run(codes16.size, 1, call)
    return out.view(np.float32)
