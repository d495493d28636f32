"""Training precisions: what a step stores its feature maps in (``"fp32"``, ``"fp16"``, ``"bf16"``).

Under ``fp16`` and ``bf16`` (mixed precision, as PyTorch's AMP does it) feature maps and their gradients
are stored in the low precision; the weights, their gradients and the optimizer's state stay float32, as
do batch norm's statistics and the network's output (the loss is computed in float32). A device that
computes in float32 over low-precision storage (the CPU device) rounds each output once into it. fp16
training scales its loss (:class:`vmem.optim.GradScaler`); bf16 has float32's range and needs no scaling.

bfloat16 is ``ml_dtypes.bfloat16`` (``pip install "vmem[bf16]"``), imported only where asked for.
"""

from __future__ import annotations

import numpy as np

__all__ = ["PRECISIONS", "activations_dtype", "dtype", "is_low"]

#: precision name -> the dtype feature maps are stored in
PRECISIONS = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def activations_dtype(precision: str) -> str:
    """The dtype a precision stores feature maps in; a ValueError names the precisions there are."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}: use one of {', '.join(PRECISIONS)}")
    name = PRECISIONS[precision]
    dtype(name)  # bfloat16: ml_dtypes registers it with NumPy, or a clear error
    return name


def dtype(name: str) -> np.dtype:
    """``np.dtype(name)``, ``"bfloat16"`` included (through ``ml_dtypes``, imported here when first asked for)."""
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise ImportError(
                'bf16 storage needs ml_dtypes: pip install "vmem[bf16]" (or pip install ml_dtypes)'
            ) from None
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def is_low(name: str) -> bool:
    """Whether ``name`` is a floating dtype narrower than float32 (float16, bfloat16)."""
    d = dtype(name)
    return d.itemsize < 4 and (d.kind == "f" or name == "bfloat16")
