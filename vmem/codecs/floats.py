"""Gist's delayed precision reduction: floats stored in 16, 10 or 8 bits until backward needs them.

Formats (sign-exponent-mantissa): fp16 1-5-10 (IEEE half), fp10 1-5-4 (three to a 32-bit word: word i of W holds
values i, i + W and i + 2W), fp8
1-4-3 (four to a word). Rounding is to nearest, ties to even. No denormals: magnitudes below the smallest
normal become a zero of the same sign. Values beyond the largest finite one, infinities included, are
clamped to it. NaN stays NaN (all-ones exponent, all-ones mantissa). Relative error of a value in the
normal range: at most 2^-(mantissa bits + 1).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from . import native
from .base import Codec, Encoded, kernel_dtype, flat, narrowed_into, output, shape_of, widened

if TYPE_CHECKING:
    from .._typing import Array

__all__ = ["DPR", "FORMATS", "quantize"]

FORMATS = {"fp16": (5, 10), "fp10": (5, 4), "fp8": (4, 3)}  # exponent bits, mantissa bits


def _encode(x: np.ndarray, ebits: int, mbits: int) -> np.ndarray:
    """float32 -> codes (uint16) of a 1-ebits-mbits format."""
    bits = x.astype(np.float32).view(np.uint32)
    sign = (bits >> 31).astype(np.uint32)
    mag = bits & np.uint32(0x7FFFFFFF)
    nan = mag > np.uint32(0x7F800000)
    shift = 23 - mbits
    lsb = (mag >> np.uint32(shift)) & np.uint32(1)
    rounded = (mag.astype(np.uint64) + ((1 << (shift - 1)) - 1) + lsb) >> np.uint64(shift)  # e8 << mbits | m
    bias = (1 << (ebits - 1)) - 1
    top = (1 << ebits) - 1  # reserved for NaN
    e = (rounded >> np.uint64(mbits)).astype(np.int64) - 127 + bias
    m = (rounded & np.uint64((1 << mbits) - 1)).astype(np.int64)
    under = e <= 0
    over = e >= top
    e = np.where(over, top - 1, np.where(under, 0, e))
    m = np.where(over, (1 << mbits) - 1, np.where(under, 0, m))
    e = np.where(nan, top, e)
    m = np.where(nan, (1 << mbits) - 1, m)
    return ((sign.astype(np.int64) << (ebits + mbits)) | (e << mbits) | m).astype(np.uint16)


def _decode(codes: np.ndarray, ebits: int, mbits: int) -> np.ndarray:
    c = codes.astype(np.uint32)
    sign = (c >> np.uint32(ebits + mbits)) & np.uint32(1)
    e = (c >> np.uint32(mbits)) & np.uint32((1 << ebits) - 1)
    m = c & np.uint32((1 << mbits) - 1)
    bias = (1 << (ebits - 1)) - 1
    top = (1 << ebits) - 1
    exp32 = np.where(e == 0, 0, np.where(e == top, 255, e.astype(np.int64) - bias + 127)).astype(np.uint32)
    mant = np.where(e == 0, 0, m << np.uint32(23 - mbits)).astype(np.uint32)
    mant = np.where(e == top, np.uint32(0x7FFFFF), mant)
    return ((sign << np.uint32(31)) | (exp32 << np.uint32(23)) | mant).view(np.float32)


def quantize(x: Array, fmt: str) -> np.ndarray:
    """Round ``x`` through format ``fmt`` and back (the values DPR's decode gives), as float32."""
    ebits, mbits = FORMATS[fmt]
    return _decode(_encode(flat(x), ebits, mbits), ebits, mbits).reshape(np.shape(x))


class DPR(Codec):
    """``dpr`` with ``format="fp16"|"fp10"|"fp8"`` (see the module docstring for rounding and limits)."""

    name = "dpr"
    lossless = False
    gpu = True

    def __init__(self, format: str = "fp16"):
        if format not in FORMATS:
            raise ValueError(f"dpr: format={format!r}; use one of {', '.join(FORMATS)}")
        self.format = format
        self.ebits, self.mbits = FORMATS[format]

    @property
    def spec(self) -> str:
        return f"dpr:format={self.format}"

    @property
    def relative_bound(self) -> float:
        """Largest relative error of a value in the format's normal range."""
        return 2.0 ** -(self.mbits + 1)

    def encode(self, x: Array, *, reference: bool = False) -> Encoded:
        v = flat(x)
        if (
            not reference and kernel_dtype(v.dtype) and (on := native.backend(v)) is not None
        ):  # 16-bit floats: widened first (exact)
            return Encoded(self.spec, shape_of(x), v.dtype, {"codes": native.dpr_encode(widened(v), self.format, on)})
        codes = _encode(v, self.ebits, self.mbits)
        if self.format == "fp16":
            packed = codes
        elif self.format == "fp8":
            packed = codes.astype(np.uint8)
        else:  # three 10-bit codes per 32-bit word, planar: word i holds values i, i + W, i + 2W
            padded = np.zeros(-(-v.size // 3) * 3, np.uint32)
            padded[: v.size] = codes
            t = padded.reshape(3, -1)
            packed = t[0] | (t[1] << np.uint32(10)) | (t[2] << np.uint32(20))
        return Encoded(self.spec, shape_of(x), v.dtype, {"codes": packed})

    def decode(self, enc: Encoded, out: Array | None = None, *, reference: bool = False) -> np.ndarray:
        res = output(enc, out)
        r = res.reshape(-1)
        packed = enc.arrays["codes"]
        if not reference and kernel_dtype(r.dtype) and r.flags.c_contiguous and (on := native.backend(r)) is not None:
            narrowed_into(r, lambda dst: native.dpr_decode(packed, self.format, dst, on))
            return res
        if self.format == "fp10":
            w = packed.astype(np.uint32)
            codes = np.concatenate([w & 0x3FF, (w >> 10) & 0x3FF, (w >> 20) & 0x3FF])[: enc.size]
        else:
            codes = packed
        r[...] = _decode(codes, self.ebits, self.mbits)
        return res

    def encoded_nbytes(self, shape, dtype="float32", density=None) -> int:
        n = math.prod(shape)
        return {"fp16": 2 * n, "fp10": 4 * -(-n // 3), "fp8": n}[self.format]
