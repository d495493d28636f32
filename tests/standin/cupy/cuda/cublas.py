"""``cupy.cuda.cublas`` on the stand-in: ``gemmEx`` as cuBLAS computes it, column-major, on the memory behind its
pointers, in stream order on the current stream.

What cuBLAS refuses is refused (``CUBLASError``): a compute type other than CUBLAS_COMPUTE_32F (the only one vmem
asks for), operands of two types, a result type other than theirs or FP32, a leading dimension shorter than its
matrix's, a pointer outside device memory. Half operands are read into FP32, the products summed in FP32 and each
output rounded once into C's type, as the tensor cores' FP32 accumulation does.
"""

from __future__ import annotations

import ctypes
import numpy as np

COMPUTE_32F = 68
CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF = 0, 2, 14
OP_N, OP_T = 0, 1
#: (A type, C type, compute type) of every gemmEx run
calls: list[tuple[int, int, int]] = []


class CUBLASError(RuntimeError):
    pass


def _dtype(code: int) -> np.dtype:
    if code == CUDA_R_16BF:
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return {CUDA_R_32F: np.dtype(np.float32), CUDA_R_16F: np.dtype(np.float16)}[code]


def _matrix(ptr: int, code: int, rows: int, cols: int, ld: int, what: str) -> np.ndarray:
    """The column-major ``rows`` x ``cols`` matrix at ``ptr`` with leading dimension ``ld``, as a NumPy view."""
    from .. import _state

    if ld < max(1, rows):
        raise CUBLASError(f"CUBLAS_STATUS_INVALID_VALUE: {what}'s leading dimension {ld} < its {rows} rows")
    dt = _dtype(code)
    nbytes = ((cols - 1) * ld + rows) * dt.itemsize
    region = _state.device_region(ptr, nbytes, f"a cuBLAS matrix ({what})")
    strides = (dt.itemsize, ld * dt.itemsize)  # column-major
    return np.ndarray((rows, cols), dt, buffer=region.buffer, offset=ptr - region.ptr, strides=strides)


def gemmEx(
    handle: int,
    transa: int,
    transb: int,
    m: int,
    n: int,
    k: int,
    alpha: int,
    A: int,
    Atype: int,
    lda: int,
    B: int,
    Btype: int,
    ldb: int,
    beta: int,
    C: int,
    Ctype: int,
    ldc: int,
    computeType: int,
    algo: int,
) -> None:
    from .. import _state

    if computeType != COMPUTE_32F:
        raise CUBLASError(f"CUBLAS_STATUS_NOT_SUPPORTED: compute type {computeType} (the stand-in keeps 32F)")
    if Atype != Btype or Ctype not in (Atype, CUDA_R_32F) or Atype not in (CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF):
        raise CUBLASError(f"CUBLAS_STATUS_NOT_SUPPORTED: A {Atype}, B {Btype}, C {Ctype}")
    a = _matrix(A, Atype, *((m, k) if transa == OP_N else (k, m)), lda, "A")
    b = _matrix(B, Btype, *((k, n) if transb == OP_N else (n, k)), ldb, "B")
    c = _matrix(C, Ctype, m, n, ldc, "C")
    one = ctypes.c_float.from_address(alpha).value  # host pointer mode: read at the call (a capture keeps them)
    zero = ctypes.c_float.from_address(beta).value
    calls.append((Atype, Ctype, computeType))

    def work() -> None:
        opa = a.astype(np.float32) if transa == OP_N else a.T.astype(np.float32)
        opb = b.astype(np.float32) if transb == OP_N else b.T.astype(np.float32)
        result = np.float32(one) * (opa @ opb)
        if zero != 0.0:
            result += np.float32(zero) * c.astype(np.float32)
        c[...] = result.astype(c.dtype)  # one rounding into C's type

    _state.submit_current(work, ("cublas", "gemmEx"))
