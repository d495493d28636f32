"""The CPU build of native/kernels.cuh (``vmem._native``, compiled by cffi at install), or nothing.

``available()`` says whether it loaded; without a C compiler at install time the codecs use their NumPy
reference implementations and vmem warns once.
"""

from __future__ import annotations

import warnings

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


def _ptr(a: np.ndarray, ctype: str):
    """A C pointer into ``a``. The caller must keep ``a`` (not only a view's base) alive during the call:
    pass arrays bound to local names, never temporaries."""
    return ffi.cast(ctype, ffi.from_buffer(a))


def binarize_encode(v: np.ndarray) -> np.ndarray:
    bits = np.empty(-(-v.size // 8), np.uint8)
    lib.vmem_binarize_encode(_ptr(v, "float *"), _ptr(bits, "uint8_t *"), v.size)
    return bits


def binarize_decode(bits: np.ndarray, out: np.ndarray) -> None:
    lib.vmem_binarize_decode(_ptr(bits, "uint8_t *"), _ptr(out, "float *"), out.size)


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
    lib.vmem_dpr_encode(_ptr(v.view(np.uint32), "uint32_t *"), _ptr(codes, "uint16_t *"), v.size, ebits, mbits)
    return codes


def dpr_decode(codes: np.ndarray, ebits: int, mbits: int) -> np.ndarray:
    out = np.empty(codes.size, np.uint32)
    codes16 = np.ascontiguousarray(codes, np.uint16)  # bound to a name: it must outlive the call
    lib.vmem_dpr_decode(_ptr(codes16, "uint16_t *"), _ptr(out, "uint32_t *"), codes16.size, ebits, mbits)
    return out.view(np.float32)
