"""Copies a pass keeps at the start of its workspace (a uint8 array the plan sized): where each goes, aligned,
and how many bytes they take. A convolution's half weights and NCHW copies (:mod:`.cuda.conv`) and a half
linear layer's (:mod:`.kernel_ops`) are carved so, and sized by the same rule in the catalog."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import DTypeLike

__all__ = ["ALIGN", "aligned_bytes", "carve"]

#: where each copy starts (bytes)
ALIGN = 256


def aligned_bytes(shape: tuple[int, ...], itemsize: int = 4) -> int:
    """Bytes of an array of ``shape`` with ``itemsize``-byte values, rounded up to :data:`ALIGN`."""
    return -(-itemsize * math.prod(shape) // ALIGN) * ALIGN


def carve(ws: Any, dtype: DTypeLike, *shapes: tuple[int, ...]) -> tuple[list[Any], Any]:
    """Arrays of ``dtype`` at the start of the workspace ``ws`` (a uint8 array), one per shape in order, each
    aligned; and the rest of the workspace after them (None if nothing is left)."""
    dtype = np.dtype(dtype)
    out, offset = [], 0
    for shape in shapes:
        n = dtype.itemsize * math.prod(shape)
        if ws is None or offset + n > ws.nbytes:
            raise ValueError(f"a workspace of {0 if ws is None else ws.nbytes} bytes cannot hold its copies {shapes}")
        out.append(ws[offset : offset + n].view(dtype).reshape(shape))
        offset += aligned_bytes(shape, dtype.itemsize)
    rest = ws[offset:] if ws is not None and offset < ws.nbytes else None
    return out, rest
