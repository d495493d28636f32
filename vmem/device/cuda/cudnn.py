"""cuDNN's legacy convolution API through cffi (ABI mode), for the CUDA device.

CuPy 14 removed its cuDNN bindings, so vmem declares what it calls (vmem/csrc/cudnn.h, from cuDNN 9's
headers) and loads ``libcudnn.so.9`` from the ``nvidia-cudnn-cu13`` wheel. Descriptors can be made and
output shapes computed without a GPU; anything that needs a handle (workspace sizes, algorithm search,
the convolutions) needs one. Enum values are cuDNN 9's (see docs/gpu.md); algorithms carry the names
the simulator's catalog uses (:mod:`vmem.device.cudnn_catalog`).
"""

from __future__ import annotations

import threading
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..._resources import source_file
from ...errors import DeviceError
from ..spec import check_math

__all__ = [
    "lib",
    "ffi",
    "CudnnError",
    "check",
    "version",
    "Handle",
    "TensorDesc",
    "FilterDesc",
    "ConvDesc",
    "conv_output_shape",
    "ALGOS",
    "NONDETERMINISTIC",
    "FLOAT",
    "NCHW",
    "NHWC",
    "FMA_MATH",
    "TENSOR_OP_MATH",
    "DEFAULT_MATH",
    "HALF",
    "BFLOAT16",
    "DATA_TYPES",
    "conv_types",
    "math_types",
    "pair",
    "unpair",
    "MATH_NAMES",
    "describe",
]

FLOAT, DOUBLE, HALF, BFLOAT16 = 0, 1, 2, 9
NCHW, NHWC = 0, 1
CROSS_CORRELATION = 1
DEFAULT_MATH, TENSOR_OP_MATH, TENSOR_OP_CONVERSION_MATH, FMA_MATH = 0, 1, 2, 3
#: cudnnMathType_t by value, as an algorithm's name carries it (``implicit_precomp_gemm@fma``)
MATH_NAMES = {
    DEFAULT_MATH: "default",
    TENSOR_OP_MATH: "tensor_op",
    TENSOR_OP_CONVERSION_MATH: "conversion",
    FMA_MATH: "fma",
}
#: cuDNN's data type of each storage dtype vmem hands it
DATA_TYPES = {"float32": FLOAT, "float64": DOUBLE, "float16": HALF, "bfloat16": BFLOAT16}


def conv_types(dtype: str, math: str) -> tuple[int, int, int]:
    """(data type, compute type, math type) of a convolution on ``dtype`` data on a device whose FP32 math is
    ``math`` (``DeviceSpec.math``): FP32 exact with FMA math (no TF32), FP32 "tf32" with cuDNN's default
    math (tensor cores round the inputs to TF32 on Ampere and later, as PyTorch's default does); fp16 and
    bf16 as pseudo-half (the data in half, the compute type FLOAT, tensor-op math), whatever ``math`` is."""
    if dtype not in DATA_TYPES:
        raise ValueError(f"cuDNN convolutions of {dtype}: vmem hands cuDNN {', '.join(DATA_TYPES)}")
    check_math("a cuDNN convolution", math)
    data = DATA_TYPES[dtype]
    if data in (HALF, BFLOAT16):
        return data, FLOAT, TENSOR_OP_MATH
    if data == DOUBLE:
        return data, DOUBLE, FMA_MATH
    return data, FLOAT, DEFAULT_MATH if math == "tf32" else FMA_MATH


def math_types(dtype: str, math: str) -> tuple[int, ...]:
    """The math types a convolution on ``dtype`` data may run in on a device whose FP32 math is ``math``,
    the descriptor's own (:func:`conv_types`) first. cuDNN lists an algorithm once per math type it has
    kernels for (``Find*Ex``, ``Get*Algorithm_v7``), and which one runs is the descriptor's math type at the
    call: exact FP32 (and FP64) only in FMA math (tensor cores would round the inputs to TF32); TF32 in the
    default or tensor-op math (both let tensor cores round to TF32) or FMA; half precision in tensor-op,
    default or FMA math. ``TENSOR_OP_MATH_ALLOW_CONVERSION`` (FP32 down-converted to FP16) never."""
    _, _, own = conv_types(dtype, math)
    if own == FMA_MATH:
        return (FMA_MATH,)
    return tuple(dict.fromkeys((own, DEFAULT_MATH, TENSOR_OP_MATH, FMA_MATH)))


def pair(algo: str, math_type: int, own: int) -> str:
    """The name of ``algo`` run in ``math_type`` on a descriptor whose own math type is ``own``: the
    algorithm's name in its own math type, ``algo@<math>`` in another (``MATH_NAMES``)."""
    return algo if math_type == own else f"{algo}@{MATH_NAMES[math_type]}"


def unpair(name: str) -> tuple[str, int | None]:
    """(algorithm, math type) of a name made by :func:`pair`; the math type None for the descriptor's own."""
    algo, _, math_name = name.partition("@")
    if not math_name:
        return algo, None
    for value, known in MATH_NAMES.items():
        if known == math_name:
            return algo, value
    raise ValueError(f"cuDNN algorithm {name!r}: no math type {math_name!r} (known: {', '.join(MATH_NAMES.values())})")


SUCCESS, NOT_INITIALIZED, BAD_PARAM, NOT_SUPPORTED = 0, 1001, 2000, 3000

#: Algorithm names by pass, in enum order (the index is cuDNN's enum value).
ALGOS = {
    "forward": [
        "implicit_gemm",
        "implicit_precomp_gemm",
        "gemm",
        "direct",
        "fft",
        "fft_tiling",
        "winograd",
        "winograd_nonfused",
    ],
    "backward_data": ["algo_0", "algo_1", "fft", "fft_tiling", "winograd", "winograd_nonfused"],
    "backward_filter": ["algo_0", "algo_1", "fft", "algo_3", "winograd", "winograd_nonfused", "fft_tiling"],
}
#: Algorithms that sum with atomics: their results vary from run to run (not bitwise reproducible).
NONDETERMINISTIC = {"backward_data": {"algo_0"}, "backward_filter": {"algo_0", "algo_3"}}

_HEADER = "cudnn.h"  # in vmem/csrc


class CudnnError(DeviceError):
    """A cuDNN call failed; ``status`` is cuDNN's code."""

    def __init__(self, call: str, status: int, message: str):
        super().__init__(f"{call}: cuDNN error {status} ({message})")
        self.status = status


@lru_cache(maxsize=1)
def _load() -> tuple[Any, Any]:
    try:
        import cffi
    except ImportError as exc:  # pragma: no cover - cffi is a core dependency
        raise DeviceError("cuDNN needs cffi (a core dependency of vmem): pip install cffi") from exc
    ffi = cffi.FFI()
    ffi.cdef(source_file(_HEADER).read_text())
    path = _library_path()
    try:
        return ffi, ffi.dlopen(path)
    except OSError as exc:
        raise DeviceError(f"cannot load cuDNN from {path}: {exc}; install it with pip install 'vmem[cuda]'") from exc


def _library_path() -> str:
    """libcudnn.so.9 of the nvidia-cudnn-cu13 wheel (through cuda-pathfinder when it is installed)."""
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        return load_nvidia_dynamic_lib("cudnn").abs_path
    except Exception:  # noqa: BLE001 - fall back to the wheel's folder, then the system's loader
        pass
    try:
        import nvidia.cudnn  # type: ignore[import-not-found]

        for base in nvidia.cudnn.__path__:
            candidate = Path(base) / "lib" / "libcudnn.so.9"
            if candidate.exists():
                return str(candidate)
    except ImportError:
        pass
    return "libcudnn.so.9"


def ffi() -> Any:
    return _load()[0]


def lib() -> Any:
    return _load()[1]


def check(call: str, status: int) -> None:
    if status != SUCCESS:
        raise CudnnError(call, status, ffi().string(lib().cudnnGetErrorString(status)).decode())


def version() -> int:
    """cuDNN's version as an int (9.28.1 -> 92801)."""
    return int(lib().cudnnGetVersion())


def _make(kind: str) -> Any:
    out = ffi().new(f"cudnn{kind}_t *")
    check(f"cudnnCreate{kind}", getattr(lib(), f"cudnnCreate{kind}")(out))
    return ffi().gc(out[0], getattr(lib(), f"cudnnDestroy{kind}"))


class TensorDesc:
    """A 4-D tensor descriptor: logical (N, C, H, W) stored NCHW or NHWC (vmem stores channels last)."""

    def __init__(self, n: int, c: int, h: int, w: int, layout: int = NHWC, dtype: int = FLOAT):
        self.shape = (n, c, h, w)
        self.ptr = _make("TensorDescriptor")
        check("cudnnSetTensor4dDescriptor", lib().cudnnSetTensor4dDescriptor(self.ptr, layout, dtype, n, c, h, w))


class FilterDesc:
    """A filter descriptor: K output and C input channels, kh x kw; NHWC means KRSC (vmem's layout)."""

    def __init__(self, k: int, c: int, kh: int, kw: int, layout: int = NHWC, dtype: int = FLOAT):
        self.shape = (k, c, kh, kw)
        self.ptr = _make("FilterDescriptor")
        # dataType comes before format here, unlike the tensor descriptor (docs/gpu.md)
        check("cudnnSetFilter4dDescriptor", lib().cudnnSetFilter4dDescriptor(self.ptr, dtype, layout, k, c, kh, kw))


class ConvDesc:
    """A 2-D cross-correlation computing in ``dtype`` (the compute type) with FMA math (exact FP32: no TF32)
    unless ``math`` says otherwise (see :func:`conv_types`), in ``groups`` groups (the filter descriptor then
    holds C / groups input channels)."""

    def __init__(
        self,
        padding: tuple[int, int],
        stride: tuple[int, int],
        dilation: tuple[int, int] = (1, 1),
        dtype: int = FLOAT,
        math: int = FMA_MATH,
        groups: int = 1,
    ):
        self.ptr = _make("ConvolutionDescriptor")
        check(
            "cudnnSetConvolution2dDescriptor",
            lib().cudnnSetConvolution2dDescriptor(
                self.ptr,
                padding[0],
                padding[1],
                stride[0],
                stride[1],
                dilation[0],
                dilation[1],
                CROSS_CORRELATION,
                dtype,
            ),
        )
        self.own = self.math = math
        check("cudnnSetConvolutionMathType", lib().cudnnSetConvolutionMathType(self.ptr, math))
        if groups > 1:
            check("cudnnSetConvolutionGroupCount", lib().cudnnSetConvolutionGroupCount(self.ptr, groups))

    def set_math(self, math: int | None) -> None:
        """Make ``math`` (its own where None) the math type the next call on this descriptor runs in: cuDNN
        chooses tensor-core kernels or not by the algorithm and the descriptor's math type together."""
        math = self.own if math is None else math
        if math != self.math:
            check("cudnnSetConvolutionMathType", lib().cudnnSetConvolutionMathType(self.ptr, math))
            self.math = math


def describe(x: TensorDesc, w: FilterDesc, conv: ConvDesc) -> dict[str, int]:
    """What cuDNN holds in the descriptors, read back (works without a GPU): the data types of the tensor
    and the filter, the convolution's compute type and math type."""
    f, lib_ = ffi(), lib()
    ints = [f.new("int *") for _ in range(8)]
    x_type = f.new("cudnnDataType_t *")
    check("cudnnGetTensor4dDescriptor", lib_.cudnnGetTensor4dDescriptor(x.ptr, x_type, *ints[:4], *ints[4:8]))
    w_type, w_format = f.new("cudnnDataType_t *"), f.new("cudnnTensorFormat_t *")
    check("cudnnGetFilter4dDescriptor", lib_.cudnnGetFilter4dDescriptor(w.ptr, w_type, w_format, *ints[:4]))
    mode, compute = f.new("cudnnConvolutionMode_t *"), f.new("cudnnDataType_t *")
    check("cudnnGetConvolution2dDescriptor", lib_.cudnnGetConvolution2dDescriptor(conv.ptr, *ints[:6], mode, compute))
    math = f.new("cudnnMathType_t *")
    check("cudnnGetConvolutionMathType", lib_.cudnnGetConvolutionMathType(conv.ptr, math))
    return {
        "x_type": int(x_type[0]),
        "w_type": int(w_type[0]),
        "w_format": int(w_format[0]),
        "compute_type": int(compute[0]),
        "math_type": int(math[0]),
    }


def conv_output_shape(x: TensorDesc, w: FilterDesc, conv: ConvDesc) -> tuple[int, int, int, int]:
    """(N, K, Ho, Wo) as cuDNN computes it (works without a GPU)."""
    dims = [ffi().new("int *") for _ in range(4)]
    check(
        "cudnnGetConvolution2dForwardOutputDim",
        lib().cudnnGetConvolution2dForwardOutputDim(conv.ptr, x.ptr, w.ptr, *dims),
    )
    return tuple(int(d[0]) for d in dims)  # type: ignore[return-value]


class Handle:
    """A cuDNN handle bound to one stream for its whole life (cudnnSetStream queries the driver on every
    call, so vmem makes one handle per stream and sets its stream once). Needs a GPU."""

    def __init__(self, stream_ptr: int):
        out = ffi().new("cudnnHandle_t *")
        check("cudnnCreate", lib().cudnnCreate(out))
        self.ptr = out[0]
        self._lock = threading.Lock()
        check("cudnnSetStream", lib().cudnnSetStream(self.ptr, ffi().cast("cudaStream_t", stream_ptr)))

    def close(self) -> None:
        if self.ptr is not None:
            lib().cudnnDestroy(self.ptr)
            self.ptr = None

    def __del__(self) -> None:  # pragma: no cover - depends on the collector
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass
