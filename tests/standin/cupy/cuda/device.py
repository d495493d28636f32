"""``cupy.cuda.device`` on the stand-in: the current device's library handles."""

from __future__ import annotations


def get_cublas_handle() -> int:
    """A cuBLAS handle of the current device (the stand-in's cuBLAS sets its stream at each call, as CuPy's)."""
    return 0x1B1A5
