"""Low-bit approximations: per-channel fixed point and 2-bit 4x4 patches.

``fixed`` (``bits=8`` or ``4``): each channel (axis 1 of NCHW or (N, C)) is quantized uniformly between
its minimum and maximum (or a range a policy supplies, e.g. from batch-norm statistics): error at most
half a step, (max - min) / (2^bits - 1) / 2. ``patch2``: each 4x4 spatial patch of an NCHW tensor is
quantized to four levels between its own minimum and maximum: error at most (max - min) / 6.

Non-finite values are not representable: ranges are taken over finite values and NaN or infinities
decode to the range's minimum (a fixed-point code of 0).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import native
from .base import Codec, Encoded, output

__all__ = ["Fixed", "Patch2"]


def _pack(codes: np.ndarray, bits: int) -> np.ndarray:
    if bits == 8:
        return codes.astype(np.uint8)
    per = 8 // bits
    padded = np.zeros(-(-codes.size // per) * per, np.uint8)
    padded[: codes.size] = codes
    t = padded.reshape(-1, per)
    out = np.zeros(t.shape[0], np.uint8)
    for i in range(per):
        out |= t[:, i] << np.uint8(i * bits)
    return out


def _unpack(packed: np.ndarray, bits: int, n: int) -> np.ndarray:
    if bits == 8:
        return packed[:n]
    per = 8 // bits
    mask = np.uint8((1 << bits) - 1)
    return np.stack([(packed >> np.uint8(i * bits)) & mask for i in range(per)], axis=1).reshape(-1)[:n]


def _finite_range(x: np.ndarray, axis: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    finite = np.isfinite(x)
    lo = np.where(finite, x, np.inf).min(axis=axis, keepdims=True, initial=np.inf)
    hi = np.where(finite, x, -np.inf).max(axis=axis, keepdims=True, initial=-np.inf)
    empty = ~np.isfinite(lo)
    return np.where(empty, 0, lo).astype(np.float32), np.where(empty, 0, hi).astype(np.float32)


def _quantize(x: np.ndarray, lo: np.ndarray, hi: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray]:
    scale = (hi - lo) / levels
    safe = np.where(scale > 0, scale, 1.0).astype(np.float32)
    q = np.rint((np.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0) - lo) / safe)
    q = np.where(np.isfinite(x), q, 0)
    return np.clip(q, 0, levels).astype(np.uint8), scale.astype(np.float32)


class Fixed(Codec):
    """``fixed`` with ``bits=8|4``: per-channel uniform quantization (see the module docstring)."""

    name = "fixed"
    lossless = False

    def __init__(self, bits: int = 8):
        if bits not in (4, 8):
            raise ValueError(f"fixed: bits={bits!r}; use 8 or 4")
        self.bits = bits

    @property
    def spec(self) -> str:
        return f"fixed:bits={self.bits}"

    def encode(self, x: Any, lo: Any = None, hi: Any = None, *, axis: int = 1, reference: bool = False) -> Encoded:
        """Quantize ``x`` per channel of ``axis`` (1 for NCHW, -1 for channels last) between ``lo`` and
        ``hi`` (per channel; default: each channel's finite range)."""
        a = np.asarray(x)
        if a.ndim < 2:
            raise ValueError(f"fixed: needs a tensor with a channel axis (N, C, ...), got shape {a.shape}")
        axis = axis % a.ndim
        shape = [1] * a.ndim
        shape[axis] = -1
        if lo is None or hi is None:
            lo, hi = _finite_range(a, tuple(i for i in range(a.ndim) if i != axis))
        lo = np.ascontiguousarray(lo, np.float32).reshape(-1)
        hi = np.ascontiguousarray(hi, np.float32).reshape(-1)
        levels = (1 << self.bits) - 1
        scale = ((hi - lo) / np.float32(levels)).astype(np.float32)
        inner = math.prod(a.shape[axis + 1:])
        meta = {"axis": axis}
        if not reference and a.dtype == np.float32 and native.available():
            codes = native.fixed_encode(np.ascontiguousarray(a).reshape(-1), lo, scale, inner, self.bits)
        else:
            q, _ = _quantize(a, lo.reshape(shape), hi.reshape(shape), levels)
            codes = _pack(q.reshape(-1), self.bits)
        return Encoded(self.spec, a.shape, a.dtype, {"codes": codes, "lo": lo, "scale": scale}, meta)

    def decode(self, enc: Encoded, out: Any = None, *, reference: bool = False) -> np.ndarray:
        res = output(enc, out)
        axis = enc.meta.get("axis", 1)
        lo, scale = enc.arrays["lo"], enc.arrays["scale"]
        r = res.reshape(-1)
        if not reference and res.dtype == np.float32 and r.flags.c_contiguous and native.available():
            native.fixed_decode(enc.arrays["codes"], lo, scale, math.prod(enc.shape[axis + 1:]), self.bits, r)
            return res
        shape = [1] * len(enc.shape)
        shape[axis] = -1
        q = _unpack(enc.arrays["codes"], self.bits, enc.size).reshape(enc.shape)
        res[...] = lo.reshape(shape) + q * scale.reshape(shape)
        return res

    def encoded_nbytes(self, shape, dtype="float32", density=None) -> int:
        return -(-math.prod(shape) * self.bits // 8) + 8 * shape[1]


class Patch2(Codec):
    """``patch2``: 2 bits per value, four levels between the minimum and maximum of each 4x4 spatial
    patch of an (N, C, H, W) tensor (edges padded)."""

    name = "patch2"
    lossless = False
    P = 4

    def _patches(self, a: np.ndarray) -> np.ndarray:
        n, c, h, w = a.shape
        hp, wp = -(-h // self.P) * self.P, -(-w // self.P) * self.P
        padded = np.empty((n, c, hp, wp), np.float32)
        padded[...] = np.nan  # padding is not data: excluded from the ranges
        padded[:, :, :h, :w] = a
        return padded.reshape(n, c, hp // self.P, self.P, wp // self.P, self.P)

    def encode(self, x: Any) -> Encoded:
        a = np.asarray(x)
        if a.ndim != 4:
            raise ValueError(f"patch2: needs an (N, C, H, W) tensor, got shape {a.shape}")
        p = self._patches(a)
        lo, hi = _finite_range(p, (3, 5))
        q, scale = _quantize(p, lo, hi, 3)
        return Encoded(self.name, a.shape, a.dtype, {"codes": _pack(q.reshape(-1), 2), "lo": lo, "scale": scale})

    def decode(self, enc: Encoded, out: Any = None) -> np.ndarray:
        res = output(enc, out)
        n, c, h, w = enc.shape
        lo = enc.arrays["lo"]
        shape = (n, c, lo.shape[2], self.P, lo.shape[4], self.P)
        q = _unpack(enc.arrays["codes"], 2, math.prod(shape)).reshape(shape)
        full = (lo + q * enc.arrays["scale"]).reshape(n, c, shape[2] * self.P, shape[4] * self.P)
        res[...] = full[:, :, :h, :w]
        return res

    def encoded_nbytes(self, shape, dtype="float32", density=None) -> int:
        n, c, h, w = shape
        patches = n * c * -(-h // self.P) * -(-w // self.P)
        return patches * self.P * self.P // 4 + 8 * patches
