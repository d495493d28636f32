"""Matrix products on cuBLAS for the CUDA device's linear layers over fp16/bf16 maps: ``cublasGemmEx`` with
FP32 accumulation (``CUBLAS_COMPUTE_32F``), half operands, and a result in half or in FP32 (a weight's
gradient goes straight into its FP32 buffer), each output rounded once, as PyTorch's autocast runs
``torch.nn.Linear`` on tensor cores.

cuBLAS is column-major and vmem's arrays are row-major: a row-major ``(r, c)`` matrix is cuBLAS's ``(c, r)``
matrix with leading dimension ``c``, so ``C = op(A) @ op(B)`` is asked of cuBLAS as ``C^T = op(B)^T @
op(A)^T``. Enum values are cuBLAS 13's and the CUDA runtime's (``cublas_api.h``, ``library_types.h``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ..._typing import GpuArray

__all__ = ["DATA_TYPES", "COMPUTE_32F", "gemm"]

#: cudaDataType_t of the types a product reads or writes
DATA_TYPES = {"float32": 0, "float16": 2, "bfloat16": 14}
#: cublasComputeType_t: accumulate in FP32 (no TF32, no reduced-precision reduction)
COMPUTE_32F = 68
#: cublasGemmAlgo_t: cuBLAS's own choice
GEMM_DEFAULT = -1
_OP_N, _OP_T = 0, 1


@lru_cache(maxsize=1)
def _scalars() -> tuple[np.ndarray, np.ndarray]:
    """alpha = 1 and beta = 0 in host memory (cuBLAS's default pointer mode reads them at the call; a capture
    keeps their values), kept alive for the process."""
    return np.ones(1, np.float32), np.zeros(1, np.float32)


def _type(a: GpuArray) -> int:
    name = np.dtype(a.dtype).name
    if name not in DATA_TYPES:
        raise TypeError(f"cuBLAS products take {', '.join(DATA_TYPES)} here, not {name}")
    return DATA_TYPES[name]


def gemm(a: GpuArray, b: GpuArray, c: GpuArray, trans_a: bool = False, trans_b: bool = False) -> None:
    """``c = op(a) @ op(b)`` on the current stream, where ``op`` transposes where asked: ``a`` and ``b``
    C-contiguous 2-D device arrays of one type (fp16, bf16 or fp32), ``c`` C-contiguous in their type or in
    FP32; products summed in FP32."""
    import cupy
    from cupy.cuda import cublas

    for name, x in (("a", a), ("b", b), ("c", c)):
        if x.ndim != 2 or not x.flags.c_contiguous:
            raise ValueError(f"gemm: {name} must be a C-contiguous matrix, got shape {x.shape}")
    if a.dtype != b.dtype or (c.dtype != a.dtype and np.dtype(c.dtype) != np.float32):
        raise TypeError(f"gemm: operands {a.dtype} and {b.dtype} into {c.dtype}: one type, the result in it or FP32")
    m, k = (a.shape[1], a.shape[0]) if trans_a else a.shape
    k_b, n = (b.shape[1], b.shape[0]) if trans_b else b.shape
    if k != k_b or c.shape != (m, n):
        raise ValueError(f"gemm: op(a) {m}x{k} @ op(b) {k_b}x{n} into {c.shape}")
    one, zero = _scalars()
    cublas.gemmEx(
        cupy.cuda.device.get_cublas_handle(),
        _OP_T if trans_b else _OP_N,
        _OP_T if trans_a else _OP_N,
        n,
        m,
        k,
        one.ctypes.data,
        b.data.ptr,
        _type(b),
        b.shape[1],
        a.data.ptr,
        _type(a),
        a.shape[1],
        zero.ctypes.data,
        c.data.ptr,
        _type(c),
        n,
        COMPUTE_32F,
        GEMM_DEFAULT,
    )
