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
import warnings
from typing import Any, TYPE_CHECKING

import numpy as np

from . import native
from .base import Codec, Encoded, array_module, is_half, kernel_dtype, narrowed_into, output, widened

if TYPE_CHECKING:
    from .._typing import Array

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
    """Minimum and maximum over ``axis`` of the finite values (0 and 0 where there are none)."""
    lo = x.min(axis=axis, keepdims=True, initial=np.inf)
    hi = x.max(axis=axis, keepdims=True, initial=-np.inf)
    bad = ~(np.isfinite(lo) & np.isfinite(hi))
    if bad.any():  # NaN, an infinity or nothing in some slice: take those over their finite values
        finite = np.isfinite(x)
        lo = np.where(bad, np.where(finite, x, np.inf).min(axis=axis, keepdims=True, initial=np.inf), lo)
        hi = np.where(bad, np.where(finite, x, -np.inf).max(axis=axis, keepdims=True, initial=-np.inf), hi)
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
    streams = False  # per-channel ranges: the whole tensor at once
    ranged = True

    def __init__(self, bits: int = 8):
        if bits not in (4, 8):
            raise ValueError(f"fixed: bits={bits!r}; use 8 or 4")
        self.bits = bits

    @property
    def spec(self) -> str:
        return f"fixed:bits={self.bits}"

    def encode(
        self, x: Array, lo: Array | None = None, hi: Array | None = None, *, axis: int = 1, reference: bool = False
    ) -> Encoded:
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
        inner = math.prod(a.shape[axis + 1 :])
        meta = {"axis": axis}
        if not reference and kernel_dtype(a.dtype) and native.available():
            codes = native.fixed_encode(np.ascontiguousarray(widened(a)).reshape(-1), lo, scale, inner, self.bits)
        else:
            q, _ = _quantize(a, lo.reshape(shape), hi.reshape(shape), levels)
            codes = _pack(q.reshape(-1), self.bits)
        return Encoded(self.spec, a.shape, a.dtype, {"codes": codes, "lo": lo, "scale": scale}, meta)

    def decode(self, enc: Encoded, out: Array | None = None, *, reference: bool = False) -> np.ndarray:
        res = output(enc, out)
        axis = enc.meta.get("axis", 1)
        lo, scale = enc.arrays["lo"], enc.arrays["scale"]
        r = res.reshape(-1)
        if not reference and kernel_dtype(res.dtype) and r.flags.c_contiguous and native.available():
            inner = math.prod(enc.shape[axis + 1 :])
            narrowed_into(r, lambda dst: native.fixed_decode(enc.arrays["codes"], lo, scale, inner, self.bits, dst))
            return res
        shape = [1] * len(enc.shape)
        shape[axis] = -1
        q = _unpack(enc.arrays["codes"], self.bits, enc.size).reshape(enc.shape)
        res[...] = lo.reshape(shape) + q * scale.reshape(shape)
        return res

    def encode_stored(self, x: Array, lo: Array | None = None, hi: Array | None = None) -> Encoded:
        return self.encode(x, lo, hi, axis=-1)

    def encoded_nbytes(self, shape, dtype="float32", density=None) -> int:
        return -(-math.prod(shape) * self.bits // 8) + 8 * shape[1]


def _key(x: np.ndarray) -> np.ndarray:
    """float32 -> int32 in the same order (the kernels' float_key)."""
    b = x.view(np.int32)
    return b ^ ((b >> 31) & np.int32(0x7FFFFFFF))


def _unkey(k: np.ndarray) -> np.ndarray:
    return (k ^ ((k >> 31) & np.int32(0x7FFFFFFF))).view(np.float32)


class Patch2(Codec):
    """``patch2``: 2 bits per value, four levels between the minimum and maximum of each 4x4 spatial
    patch of an (N, C, H, W) tensor (edges padded). The format follows the tensor's dtype.

    Per patch and channel, in (image, patch row, patch column, channel) order, a 32-bit word of codes
    (value (i, j) of the patch at bits 2 * (4i + j)) and:

    - float32: the patch's minimum ``lo`` and ``scale`` = (max - min) / 3 over its finite values (0 and 0
      if it has none); each code is the nearest level (12 bytes a patch).
    - float16 and bfloat16: the seed's format (Chen et al.'s 2-bit patches over mixed precision): the
      patch's minimum ``lo`` and maximum ``hi`` in the tensor's dtype (8 bytes a patch: a quarter of the
      16-bit tensor where H and W divide by 4), computed as the seed's GPU kernel computes them (each code
      the nearest of four evenly spaced levels, ties up; see :func:`_seed_encode`); decoding gives lo,
      (hi + 2 lo) / 3, (2 hi + lo) / 3 and hi, rounded to the dtype.

    ``channels_last=True`` takes and gives the tensor stored (N, H, W, C), as the devices store it."""

    name = "patch2"
    lossless = False
    streams = False  # 4x4 spatial patches: the whole tensor at once
    P = 4

    def encode(self, x: Array, *, channels_last: bool = False, reference: bool = False) -> Encoded:
        a = x if array_module(x) is not np else np.asarray(x)
        if a.ndim != 4:
            raise ValueError(f"patch2: needs an (N, C, H, W) tensor, got shape {a.shape}")
        nhwc = a if channels_last else a.transpose(0, 2, 3, 1)
        n, h, w, c = nhwc.shape
        if is_half(a.dtype):
            codes, lo, hi = _seed_encode(nhwc)
            return Encoded(self.name, (n, c, h, w), a.dtype, {"codes": codes, "lo": lo, "hi": hi})
        if not reference and a.dtype == np.float32 and native.available():
            codes, lo, scale = native.patch2_encode(np.ascontiguousarray(nhwc))
        else:
            codes, lo, scale = self._encode_reference(nhwc.astype(np.float32, copy=False))
        return Encoded(self.name, (n, c, h, w), a.dtype, {"codes": codes, "lo": lo, "scale": scale})

    def _encode_reference(self, a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n, h, w, c = a.shape
        ph, pw = -(-h // self.P), -(-w // self.P)
        padded = np.full((n, ph * self.P, pw * self.P, c), np.nan, np.float32)  # padding: not data
        padded[:, :h, :w] = a
        p = padded.reshape(n, ph, self.P, pw, self.P, c).transpose(0, 1, 3, 5, 2, 4).reshape(n, ph, pw, c, 16)
        finite = np.isfinite(p)
        k = _key(np.ascontiguousarray(p))
        kl = np.where(finite, k, np.int32(0x7FFFFFFF)).min(axis=-1)
        kh = np.where(finite, k, np.int32(-0x80000000)).max(axis=-1)
        some = kl <= kh
        lo = np.where(some, _unkey(kl), np.float32(0))
        hi = np.where(some, _unkey(kh), np.float32(0))
        q, scale = _quantize(p, lo[..., None], hi[..., None], 3)
        codes = (q.astype(np.uint32) << (2 * np.arange(16, dtype=np.uint32))).sum(axis=-1, dtype=np.uint32)
        return codes.reshape(-1), lo.reshape(-1), scale.reshape(-1)

    def decode(
        self, enc: Encoded, out: Array | None = None, *, channels_last: bool = False, reference: bool = False
    ) -> np.ndarray:
        n, c, h, w = enc.shape
        if out is None:
            xp = array_module(enc.arrays["codes"])
            out = xp.empty((n, h, w, c) if channels_last else (n, c, h, w), enc.dtype)
        res = out.transpose(0, 3, 1, 2) if channels_last else out
        output(enc, res)  # checks the shape and dtype
        nhwc = out if channels_last else out.transpose(0, 2, 3, 1)
        if "hi" in enc.arrays:  # the seed's format (16-bit floats)
            _seed_decode(enc.arrays["codes"], enc.arrays["lo"], enc.arrays["hi"], nhwc)
            return out
        codes, lo, scale = enc.arrays["codes"], enc.arrays["lo"], enc.arrays["scale"]
        if not reference and enc.dtype == np.float32 and native.available():
            if nhwc.flags.c_contiguous:
                native.patch2_decode(codes, lo, scale, nhwc)
            else:
                tmp = np.empty((n, h, w, c), np.float32)
                native.patch2_decode(codes, lo, scale, tmp)
                nhwc[...] = tmp
            return out
        ph, pw = -(-h // self.P), -(-w // self.P)
        q = (codes.reshape(n, ph, pw, c, 1) >> (2 * np.arange(16, dtype=np.uint32))) & np.uint32(3)
        vals = lo.reshape(n, ph, pw, c, 1) + q.astype(np.float32) * scale.reshape(n, ph, pw, c, 1)
        full = vals.reshape(n, ph, pw, c, self.P, self.P).transpose(0, 1, 4, 2, 5, 3)
        nhwc[...] = full.reshape(n, ph * self.P, pw * self.P, c)[:, :h, :w]
        return out

    def applies(self, shape: tuple[int, ...]) -> bool:
        return len(shape) == 4

    def encode_stored(self, x: Array, lo: Array | None = None, hi: Array | None = None) -> Encoded:
        if lo is not None or hi is not None:
            raise ValueError(f"codec {self.spec!r}: takes no per-channel range")
        return self.encode(x, channels_last=True)

    def decode_stored(self, enc: Encoded, out: Array) -> None:
        self.decode(enc, out, channels_last=True)

    def encoded_nbytes(self, shape, dtype="float32", density=None) -> int:
        n, c, h, w = shape
        patches = n * c * -(-h // self.P) * -(-w // self.P)
        return patches * (8 if is_half(dtype) else 12)  # the codes' word, then lo and hi (or lo and scale)


def _seed_encode(nhwc: Array) -> tuple[Any, Any, Any]:
    """The seed's 2-bit patches of a 16-bit (N, H, W, C) tensor: codes, lo and hi per (patch, channel).

    As its GPU kernel computes (in float32): lo and hi are the patch's minimum and maximum (NaN ignored,
    as fmaxf does); with bottom = lo * 7 / 6 - hi / 6 and s = 3 / max(hi - lo, 1e-6) (that quotient in
    double, rounded to float32), the code of x is trunc((x - bottom) * s) clamped to 0..3 (NaN: 0), the
    nearest level with ties up. Positions past the bottom or right edge repeat the patch's top-left value."""
    xp = array_module(nhwc)
    f32 = np.float32
    n, h, w, c = nhwc.shape
    ph, pw = -(-h // 4), -(-w // 4)
    x = nhwc.astype(f32)
    if h % 4 or w % 4:
        padded = xp.repeat(xp.repeat(x[:, ::4, ::4], 4, axis=1), 4, axis=2)  # each patch's top-left value
        padded[:, :h, :w] = x
        x = padded
    p = x.reshape(n, ph, 4, pw, 4, c).transpose(0, 1, 3, 5, 2, 4).reshape(n, ph, pw, c, 16)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN patch: NaN, as fmaxf gives
        lo, hi = xp.nanmin(p, axis=-1), xp.nanmax(p, axis=-1)
        bottom = (lo * f32(7)) / f32(6) - hi / f32(6)
        s = (3.0 / xp.fmax((hi - lo).astype(np.float64), 1e-6)).astype(f32)
        t = (p - bottom[..., None]) * s[..., None]
        q = xp.where(xp.isnan(t), f32(0), xp.trunc(xp.clip(t, f32(0), f32(3)))).astype(np.uint32)
    codes = (q << (2 * xp.arange(16, dtype=np.uint32))).sum(axis=-1, dtype=np.uint32)
    return codes.reshape(-1), lo.astype(nhwc.dtype).reshape(-1), hi.astype(nhwc.dtype).reshape(-1)


def _seed_decode(codes: Array, lo: Array, hi: Array, nhwc: Array) -> None:
    """Decode the seed's patches into ``nhwc`` (N, H, W, C) of their 16-bit dtype: the four levels lo,
    hi / 3 + lo * 2 / 3, hi * 2 / 3 + lo / 3, hi (computed in float32, rounded once to the dtype)."""
    xp = array_module(codes)
    f32 = np.float32
    n, h, w, c = nhwc.shape
    ph, pw = -(-h // 4), -(-w // 4)
    l32, h32 = lo.astype(f32), hi.astype(f32)
    dtype = nhwc.dtype
    levels = xp.stack(
        [
            lo,
            (h32 / f32(3) + (l32 * f32(2)) / f32(3)).astype(dtype),
            ((h32 * f32(2)) / f32(3) + l32 / f32(3)).astype(dtype),
            hi,
        ],
        axis=-1,
    )  # (patches, 4)
    q = (codes[:, None] >> (2 * xp.arange(16, dtype=np.uint32))) & np.uint32(3)
    vals = xp.take_along_axis(levels, q.astype(np.intp), axis=1)  # (patches, 16)
    full = vals.reshape(n, ph, pw, c, 4, 4).transpose(0, 1, 4, 2, 5, 3).reshape(n, ph * 4, pw * 4, c)
    nhwc[...] = full[:, :h, :w]
