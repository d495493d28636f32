"""Codecs for ReLU outputs: zero-value compression (cDMA), sparse CSR (Gist's SSDC), binarization."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from . import native
from .base import Codec, Encoded, kernel_dtype, bits_of, flat, narrowed_into, output, shape_of, widened

if TYPE_CHECKING:
    from .._typing import Array

__all__ = ["ZVC", "SSDC", "Binarize"]


def _mask_words(nonzero: np.ndarray) -> np.ndarray:
    """Nonzero flags packed 32 to a little-endian 32-bit word (bit i of word w: value 32w + i)."""
    n = nonzero.size
    padded = np.zeros(-(-n // 32) * 32, bool)
    padded[:n] = nonzero
    return np.packbits(padded, bitorder="little").view(np.uint32)


def _unmask(words: np.ndarray, n: int) -> np.ndarray:
    return np.unpackbits(words.view(np.uint8), bitorder="little")[:n].astype(bool)


class ZVC(Codec):
    """cDMA's zero-value compression: per 32 values a 32-bit mask of nonzeros, then the nonzeros (in the
    tensor's dtype: 2 bytes each for fp16 and bf16).

    Lossless, bitwise: a value is "zero" only if all its bits are zero, so -0.0, NaN and infinities are
    kept as they are. Size: 4 bytes per 32 values plus the nonzeros."""

    name = "zvc"
    data_dependent = True
    gpu = True

    def encode(self, x: Array, *, reference: bool = False) -> Encoded:
        v = flat(x)
        if (
            not reference and kernel_dtype(v.dtype) and (on := native.backend(v)) is not None
        ):  # 16-bit floats: widened (zero stays zero)
            mask, values = native.zvc_encode(widened(v), on)
            values = values.astype(v.dtype, copy=False)
        else:
            nonzero = bits_of(v) != 0
            mask, values = _mask_words(nonzero), v[nonzero]
        return Encoded(self.name, shape_of(x), v.dtype, {"mask": mask, "values": values})

    def decode(self, enc: Encoded, out: Array | None = None, *, reference: bool = False) -> np.ndarray:
        res = output(enc, out)
        r = res.reshape(-1)
        if not reference and kernel_dtype(r.dtype) and r.flags.c_contiguous and (on := native.backend(r)) is not None:
            mask, values = enc.arrays["mask"], widened(enc.arrays["values"])
            narrowed_into(r, lambda dst: native.zvc_decode(mask, values, dst, on))
            return res
        r.fill(0)
        r[_unmask(enc.arrays["mask"], enc.size)] = enc.arrays["values"]
        return res

    def encoded_nbytes(self, shape, dtype="float32", density=None) -> int:
        n = math.prod(shape)
        return 4 * -(-n // 32) + np.dtype(dtype).itemsize * round(n * (0.5 if density is None else density))


class SSDC(Codec):
    """Gist's sparse storage and dense compute: CSR over rows of at most 256 values, with 1-byte column
    indices, decoded to dense just before backward. Lossless, bitwise (nonzero as for zvc)."""

    name = "ssdc"
    data_dependent = True
    gpu = True
    ROW = 256

    def encode(self, x: Array, *, reference: bool = False) -> Encoded:
        v = flat(x)
        if not reference and kernel_dtype(v.dtype) and (on := native.backend(v)) is not None:
            row_ptr, cols, values = native.ssdc_encode(widened(v), self.ROW, on)
            values = values.astype(v.dtype, copy=False)
            return Encoded(self.name, shape_of(x), v.dtype, {"row_ptr": row_ptr, "cols": cols, "values": values})
        n = v.size
        rows = -(-n // self.ROW)
        nonzero = bits_of(v) != 0
        where = np.flatnonzero(nonzero)
        counts = np.bincount(where // self.ROW, minlength=rows)
        row_ptr = np.zeros(rows + 1, np.int32)
        np.cumsum(counts, out=row_ptr[1:])
        return Encoded(
            self.name,
            shape_of(x),
            v.dtype,
            {"row_ptr": row_ptr, "cols": (where % self.ROW).astype(np.uint8), "values": v[where]},
        )

    def decode(self, enc: Encoded, out: Array | None = None, *, reference: bool = False) -> np.ndarray:
        res = output(enc, out)
        r = res.reshape(-1)
        a = enc.arrays
        if not reference and kernel_dtype(r.dtype) and r.flags.c_contiguous and (on := native.backend(r)) is not None:
            values = widened(a["values"])
            narrowed_into(r, lambda dst: native.ssdc_decode(a["row_ptr"], a["cols"], values, dst, on))
            return res
        r.fill(0)
        row_ptr = a["row_ptr"]
        rows = np.repeat(np.arange(row_ptr.size - 1), np.diff(row_ptr))
        r[rows * self.ROW + a["cols"]] = a["values"]
        return res

    def encoded_nbytes(self, shape, dtype="float32", density=None) -> int:
        n = math.prod(shape)
        nnz = round(n * (0.5 if density is None else density))
        return 4 * (-(-n // self.ROW) + 1) + (1 + np.dtype(dtype).itemsize) * nnz


class Binarize(Codec):
    """Gist's binarization of a ReLU output: 1 bit per value, set where x > 0. Decoding gives the sign
    mask (1 where x > 0, else 0) in x's dtype: exactly what ReLU's backward needs, not the values.
    NaN is not > 0: it decodes to 0."""

    name = "binarize"
    lossless = True
    sign_only = True
    gpu = True

    def encode(self, x: Array, *, reference: bool = False) -> Encoded:
        v = flat(x)
        if not reference and kernel_dtype(v.dtype) and (on := native.backend(v)) is not None:
            bits = native.binarize_encode(v, on)  # 16-bit floats read as stored
        else:
            bits = np.packbits(v > 0, bitorder="little")
        return Encoded(self.name, shape_of(x), v.dtype, {"bits": bits})

    def encode_into(self, x: Array, raw: Array) -> Encoded | None:
        """The bits made in ``raw`` by the kernel (a captured step asks the array module for nothing)."""
        v = flat(x)
        size = -(-v.size // 8)
        if not kernel_dtype(v.dtype) or raw.nbytes < size or (on := native.backend(v)) is None:
            return None
        return Encoded(self.name, shape_of(x), v.dtype, {"bits": native.binarize_encode(v, on, out=raw[:size])})

    def decode(self, enc: Encoded, out: Array | None = None, *, reference: bool = False) -> np.ndarray:
        res = output(enc, out)
        r = res.reshape(-1)
        if not reference and kernel_dtype(r.dtype) and r.flags.c_contiguous and (on := native.backend(r)) is not None:
            narrowed_into(r, lambda dst: native.binarize_decode(enc.arrays["bits"], dst, on))
        else:
            r[...] = np.unpackbits(enc.arrays["bits"], bitorder="little", count=enc.size)
        return res

    def encoded_nbytes(self, shape, dtype="float32", density=None) -> int:
        return -(-math.prod(shape) // 8)

    @staticmethod
    def relu_backward(enc: Encoded, dy: Array, dx: Array, *, reference: bool = False) -> None:
        """ReLU's backward on the encoded output (Gist): ``dx = dy * mask``, the same bytes as
        ``dy * (y > 0)`` on the dense output, without decoding it. ``dx`` may be ``dy``."""
        bits = enc.arrays["bits"]
        if (
            not reference
            and kernel_dtype(dx.dtype)  # float32, or 16-bit floats: the same product, rounded once (exact)
            and dy.dtype == dx.dtype
            and dx.flags.c_contiguous
            and dy.flags.c_contiguous
            and (on := native.backend(dx)) is not None
        ):
            native.binarize_relu_backward(bits, dy.reshape(-1), dx.reshape(-1), on)
            return
        mask = np.unpackbits(bits, bitorder="little", count=enc.size).astype(dy.dtype).reshape(dy.shape)
        np.multiply(dy, mask, out=dx)
