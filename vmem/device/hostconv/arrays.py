"""Array helpers of the host convolutions (:mod:`vmem.device.hostconv`): image chunks, receptive-field gathering
into columns, padding borders."""

from __future__ import annotations

from typing import Any, TYPE_CHECKING

import numpy as np
from numpy.lib.stride_tricks import as_strided

if TYPE_CHECKING:
    from numpy.typing import DTypeLike


def _image_chunks(n: int, per_chunk: int):
    """(slice of images, number of images) chunks covering a batch of ``n``."""
    per_chunk = max(1, per_chunk)
    for lo in range(0, n, per_chunk):
        hi = min(lo + per_chunk, n)
        yield slice(lo, hi), hi - lo


_ONES: dict[tuple[int, Any], np.ndarray] = {}


def _ones(n: int, dtype: DTypeLike) -> np.ndarray:
    """A read-only vector of ones (the last few sizes are kept: they recur every step)."""
    key = (n, np.dtype(dtype))
    ones = _ONES.get(key)
    if ones is None:
        if len(_ONES) > 16:
            _ONES.clear()
        ones = _ONES[key] = np.ones(n, dtype=dtype)
        ones.flags.writeable = False
    return ones


def _gather(
    x: np.ndarray,
    xpad: np.ndarray | None,
    col: np.ndarray,
    kernel: tuple[int, int],
    stride: tuple[int, int],
    pad: tuple[int, int],
) -> None:
    """im2col: copy every (kh, kw, C) window of ``x`` (zero-padded through ``xpad``) into a row of ``col``."""
    n, h, w, c = x.shape
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, pad
    ho, wo = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    if ph or pw:
        assert xpad is not None
        xpad = xpad[:n]
        _zero_border(xpad, ph, pw)
        xpad[:, ph : ph + h, pw : pw + w, :] = x
        x = xpad
    s = x.strides
    windows = as_strided(x, (n, ho, wo, kh, kw, c), (s[0], s[1] * sh, s[2] * sw, s[1], s[2], s[3]), writeable=False)
    np.copyto(col.reshape(n, ho, wo, kh, kw, c), windows)


def _zero_border(xpad: np.ndarray, ph: int, pw: int) -> None:
    if ph:
        xpad[:, :ph] = 0
        xpad[:, -ph:] = 0
    if pw:
        xpad[:, :, :pw] = 0
        xpad[:, :, -pw:] = 0
