"""cuDNN's legacy convolution API on the stand-in: vmem's own declarations (vmem/csrc/cudnn.h, parsed by
cffi as on a GPU) over a library object whose functions keep descriptors as cuDNN does and compute on the
memory behind the pointers they are given (the stand-in's device memory), with the CPU device's
convolutions (:mod:`vmem.device.hostconv`) doing the arithmetic, in FP32 (pseudo-half for fp16/bf16 maps:
half data read into FP32, each output rounded once to half).

What cuDNN refuses is refused: a status other than SUCCESS where the descriptors disagree (an output
descriptor that is not the convolution's output, data types that differ), an algorithm it does not offer
for the geometry (NOT_SUPPORTED), a workspace smaller than the algorithm's (BAD_PARAM), a pointer outside
device memory (an illegal address), BackwardBias over BFLOAT16 maps (NOT_SUPPORTED: what the GPU check
found on 2026-11-28), a handle used on a stream other than the current one (work out of order), a request
for no results.

The graph (backend) API is :mod:`.cudnn_graph`'s.

What cuDNN does behind the math type is done: rankings and searches list an algorithm once per math type
it has kernels for (the GEMM-like ones in tensor-op math first, as the faster; every one in the
descriptor's own and in FMA math), and a pass on FP32 data runs as tensor cores do where the descriptor's
math type at the call is DEFAULT or TENSOR_OP: its inputs rounded to TF32 (10 mantissa bits, to nearest
even). An exact-FP32 run that took a tensor-op entry then differs from the CPU device's bits.
"""

from __future__ import annotations

import itertools
import time
from functools import lru_cache
from typing import Any

import numpy as np

import vmem
from vmem._resources import source_file
from vmem.device.hostconv import HostConv
from vmem.device.hostconv.catalog import algorithms as host_algorithms
from vmem.device.hostconv.catalog import workspace_bytes
from vmem.device.lanes import LaneOps
from vmem.nn.base import Ctx

from .cudnn_graph import GraphAPI

SUCCESS, BAD_PARAM, NOT_SUPPORTED, EXECUTION_FAILED = 0, 2000, 3000, 5000
FLOAT, DOUBLE, HALF, BFLOAT16 = 0, 1, 2, 9
NCHW, NHWC = 0, 1
_DTYPES = {FLOAT: np.dtype(np.float32), DOUBLE: np.dtype(np.float64), HALF: np.dtype(np.float16)}
#: cuDNN's algorithms the stand-in offers, per pass, and the host algorithm that computes each (the others:
#: NOT_SUPPORTED); winograd only where the host's applies
ALGOS = {
    "forward": {0: "implicit", 1: "im2col", 2: "im2col", 6: "winograd"},
    "backward_data": {0: "implicit", 1: "implicit", 4: "winograd"},
    "backward_filter": {0: "implicit", 1: "im2col", 3: "implicit"},
}
DETERMINISTIC = {"forward": {0, 1, 2, 6}, "backward_data": {1, 4}, "backward_filter": {1}}
#: the algorithms with tensor-core kernels (listed again in TENSOR_OP math, first)
TENSOR_CORE = {"forward": {0, 1}, "backward_data": {1}, "backward_filter": {1}}
DEFAULT_MATH, TENSOR_OP_MATH, FMA_MATH = 0, 1, 3
#: Get*AlgorithmMaxCount: cuDNN 9's enum sizes, twice (an algorithm in two math types)
MAX_COUNT = {"forward": 16, "backward_data": 12, "backward_filter": 14}


def tf32(a: np.ndarray) -> np.ndarray:
    """FP32 values rounded to TF32 as tensor cores read them (10 mantissa bits, to nearest even)."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32)
    rounded = (u + np.uint32(0xFFF) + ((u >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000)
    return np.where(np.isfinite(a), rounded.view(np.float32), a).astype(np.float32)


def _dtype(code: int) -> np.dtype:
    if code == BFLOAT16:
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return _DTYPES[code]


@lru_cache(maxsize=1)
def ffi() -> Any:
    import cffi

    f = cffi.FFI()
    f.cdef(source_file("cudnn.h").read_text())
    return f


class Lib(GraphAPI):
    """The functions of vmem/csrc/cudnn.h that vmem calls, on the stand-in (the graph API's:
    :class:`~.cudnn_graph.GraphAPI`)."""

    def __init__(self) -> None:
        self.ffi = ffi()
        self.objects: dict[int, dict] = {}
        self._ids = itertools.count(0x10)
        self.calls: list[str] = []
        #: (pass, algorithm, math type at the call) of every convolution run
        self.maths: list[tuple[str, int, int]] = []
        #: (pass, engine, fused) of every graph-API plan run
        self.graph_runs: list[tuple[str, tuple, bool]] = []

    # -- objects -------------------------------------------------------------------------------------
    def _new(self, out: Any, ctype: str, **state: Any) -> int:
        key = next(self._ids) * 16
        self.objects[key] = state
        out[0] = self.ffi.cast(ctype, key)
        return SUCCESS

    def _get(self, ptr: Any) -> dict:
        return self.objects[int(self.ffi.cast("intptr_t", ptr))]

    def _drop(self, ptr: Any) -> int:
        self.objects.pop(int(self.ffi.cast("intptr_t", ptr)), None)
        return SUCCESS

    def cudnnGetVersion(self) -> int:
        return 91900

    def cudnnGetErrorString(self, status: int) -> Any:
        names = {
            SUCCESS: b"CUDNN_STATUS_SUCCESS",
            BAD_PARAM: b"CUDNN_STATUS_BAD_PARAM",
            NOT_SUPPORTED: b"CUDNN_STATUS_NOT_SUPPORTED",
            EXECUTION_FAILED: b"CUDNN_STATUS_EXECUTION_FAILED",
        }
        self._message = self.ffi.new("char[]", names.get(status, b"CUDNN_STATUS_UNKNOWN"))
        return self._message

    def cudnnCreate(self, out: Any) -> int:
        return self._new(out, "cudnnHandle_t", kind="handle", stream=None)

    def cudnnDestroy(self, h: Any) -> int:
        return self._drop(h)

    def cudnnSetStream(self, h: Any, stream: Any) -> int:
        self._get(h)["stream"] = int(self.ffi.cast("intptr_t", stream))
        return SUCCESS

    def cudnnCreateTensorDescriptor(self, out: Any) -> int:
        return self._new(out, "cudnnTensorDescriptor_t", kind="tensor")

    def cudnnCreateFilterDescriptor(self, out: Any) -> int:
        return self._new(out, "cudnnFilterDescriptor_t", kind="filter")

    def cudnnCreateConvolutionDescriptor(self, out: Any) -> int:
        return self._new(out, "cudnnConvolutionDescriptor_t", kind="conv", math=0, groups=1)

    cudnnDestroyTensorDescriptor = cudnnDestroyFilterDescriptor = cudnnDestroyConvolutionDescriptor = _drop

    def cudnnSetTensor4dDescriptor(self, d: Any, fmt: int, dtype: int, n: int, c: int, h: int, w: int) -> int:
        if fmt not in (NCHW, NHWC) or dtype not in (FLOAT, DOUBLE, HALF, BFLOAT16) or min(n, c, h, w) < 1:
            return BAD_PARAM
        self._get(d).update(format=fmt, dtype=dtype, dims=(n, c, h, w))
        return SUCCESS

    def cudnnSetFilter4dDescriptor(self, d: Any, dtype: int, fmt: int, k: int, c: int, kh: int, kw: int) -> int:
        if fmt not in (NCHW, NHWC) or dtype not in (FLOAT, DOUBLE, HALF, BFLOAT16) or min(k, c, kh, kw) < 1:
            return BAD_PARAM
        self._get(d).update(format=fmt, dtype=dtype, dims=(k, c, kh, kw))
        return SUCCESS

    def cudnnSetConvolution2dDescriptor(self, d, ph, pw, sh, sw, dh, dw, mode, compute) -> int:
        if min(sh, sw, dh, dw) < 1 or min(ph, pw) < 0 or mode not in (0, 1) or compute not in (FLOAT, DOUBLE, HALF):
            return BAD_PARAM
        self._get(d).update(pad=(ph, pw), stride=(sh, sw), dilation=(dh, dw), mode=mode, compute=compute)
        return SUCCESS

    def cudnnSetConvolutionMathType(self, d: Any, math: int) -> int:
        if math not in (0, 1, 2, 3):
            return BAD_PARAM
        self._get(d)["math"] = math
        return SUCCESS

    def cudnnSetConvolutionGroupCount(self, d: Any, groups: int) -> int:
        if groups < 1:
            return BAD_PARAM
        self._get(d)["groups"] = groups
        return SUCCESS

    def cudnnGetTensor4dDescriptor(self, d, dtype, n, c, h, w, ns, cs, hs, ws) -> int:
        t = self._get(d)
        dtype[0] = t["dtype"]
        for out, v in zip((n, c, h, w), t["dims"]):
            out[0] = v
        return SUCCESS

    def cudnnGetFilter4dDescriptor(self, d, dtype, fmt, k, c, h, w) -> int:
        t = self._get(d)
        dtype[0], fmt[0] = t["dtype"], t["format"]
        for out, v in zip((k, c, h, w), t["dims"]):
            out[0] = v
        return SUCCESS

    def cudnnGetConvolution2dDescriptor(self, d, ph, pw, sh, sw, dh, dw, mode, compute) -> int:
        t = self._get(d)
        for out, v in zip((ph, pw, sh, sw, dh, dw), t["pad"] + t["stride"] + t["dilation"]):
            out[0] = v
        mode[0], compute[0] = t["mode"], t["compute"]
        return SUCCESS

    def cudnnGetConvolutionMathType(self, d: Any, math: Any) -> int:
        math[0] = self._get(d)["math"]
        return SUCCESS

    def _out_dims(self, conv: dict, x: dict, w: dict) -> tuple[int, int, int, int] | None:
        n, c, h, wd = x["dims"]
        k, cg, kh, kw = w["dims"]
        if cg * conv["groups"] != c or k % conv["groups"]:
            return None
        (ph, pw), (sh, sw), (dh, dw) = conv["pad"], conv["stride"], conv["dilation"]
        ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
        wo = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
        return (n, k, ho, wo) if ho > 0 and wo > 0 else None

    def cudnnGetConvolution2dForwardOutputDim(self, conv, x, w, n, c, h, wo) -> int:
        dims = self._out_dims(self._get(conv), self._get(x), self._get(w))
        if dims is None:
            return BAD_PARAM
        for out, v in zip((n, c, h, wo), dims):
            out[0] = v
        return SUCCESS

    # -- a convolution: its layer, the host's algorithm, its workspace ------------------------------------
    def _problem(self, pass_: str, x: Any, w: Any, conv: Any, y: Any, algo: int) -> tuple[int, Any, str, int]:
        """(status, the layer, the host algorithm, workspace bytes) of a pass on these descriptors."""
        xd, wd, cd, yd = self._get(x), self._get(w), self._get(conv), self._get(y)
        if self._out_dims(cd, xd, wd) != yd["dims"]:
            return BAD_PARAM, None, "", 0
        if not (xd["dtype"] == wd["dtype"] == yd["dtype"]) or not (xd["format"] == wd["format"] == yd["format"]):
            return BAD_PARAM, None, "", 0
        half = xd["dtype"] in (HALF, BFLOAT16)
        if half and cd["compute"] != FLOAT or not half and cd["compute"] != xd["dtype"]:
            return NOT_SUPPORTED, None, "", 0
        n, c, h, wdt = xd["dims"]
        k, _, kh, kw = wd["dims"]
        layer = vmem.nn.Conv2d(
            c, k, (kh, kw), cd["stride"], cd["pad"], bias=False, groups=cd["groups"], dilation=cd["dilation"]
        )
        host = ALGOS[pass_].get(algo)
        if host is None or host not in host_algorithms(layer, (n, c, h, wdt))[pass_]:
            return NOT_SUPPORTED, None, "", 0
        return SUCCESS, layer, host, workspace_bytes(layer, (n, c, h, wdt), pass_, host, 4)

    def _size(self, pass_, h, x, w, conv, y, algo, size) -> int:
        status, _, _, nbytes = self._problem(pass_, x, w, conv, y, algo)
        if status == SUCCESS:
            size[0] = nbytes
        return status

    def cudnnGetConvolutionForwardWorkspaceSize(self, h, x, w, conv, y, algo, size) -> int:
        return self._size("forward", h, x, w, conv, y, algo, size)

    def cudnnGetConvolutionBackwardDataWorkspaceSize(self, h, w, dy, conv, dx, algo, size) -> int:
        return self._size("backward_data", h, dx, w, conv, dy, algo, size)

    def cudnnGetConvolutionBackwardFilterWorkspaceSize(self, h, x, dy, conv, dw, algo, size) -> int:
        return self._size("backward_filter", h, x, dw, conv, dy, algo, size)

    # -- running one ---------------------------------------------------------------------------------------
    def _array(self, desc: Any, ptr: Any) -> np.ndarray:
        """The array a descriptor and a pointer name, channels last (KRSC for filters), over device memory."""
        from cupy import _state

        d = self._get(desc)
        dt = _dtype(d["dtype"])
        a, b, c, e = d["dims"]
        shape = (a, c, e, b) if d["format"] == NHWC else (a, b, c, e)
        addr = int(self.ffi.cast("intptr_t", ptr))
        nbytes = a * b * c * e * dt.itemsize
        region = _state.device_region(addr, nbytes, "a cuDNN tensor")
        arr = np.ndarray(shape, dt, buffer=region.buffer, offset=addr - region.ptr)
        return arr if d["format"] == NHWC else arr.transpose(0, 2, 3, 1)

    def _check_stream(self, h: Any) -> None:
        import cupy

        bound, current = self._get(h)["stream"], cupy.cuda.get_current_stream().ptr
        if bound != current:
            raise AssertionError(f"a cuDNN handle bound to stream {bound:#x} used while stream {current:#x} runs")

    def _run(self, pass_, h, alpha, beta, algo, ws, ws_size, x, xp, w, wp, y, yp, conv) -> int:
        self._check_stream(h)
        status, layer, host, need = self._problem(pass_, x, w, conv, y, algo)
        if status != SUCCESS:
            return status
        if ws_size < need:
            return BAD_PARAM
        from cupy import _state

        scratch = None
        if need:
            addr = int(self.ffi.cast("intptr_t", ws))
            region = _state.device_region(addr, need, "a cuDNN workspace")
            scratch = np.ndarray((need,), np.uint8, buffer=region.buffer, offset=addr - region.ptr)
        xa, wa, ya = self._array(x, xp), self._array(w, wp), self._array(y, yp)
        out = {"forward": ya, "backward_data": xa, "backward_filter": wa}[pass_]
        a = float(self.ffi.cast("float *", alpha)[0])  # the scalars are read at the call (a capture keeps them)
        b = float(self.ffi.cast("float *", beta)[0])
        math = self._get(conv)["math"]  # the math type at the call decides, as cuDNN's does
        tensor_cores = self._get(x)["dtype"] == FLOAT and math in (DEFAULT_MATH, TENSOR_OP_MATH)
        self.maths.append((pass_, algo, math))

        def work() -> None:  # on the handle's stream: now, or when a graph that captured it runs
            f32 = [np.ascontiguousarray(v, np.float32) for v in (xa, wa, ya)]
            if tensor_cores:  # the inputs the pass reads, rounded to TF32
                f32 = [
                    tf32(v) if k != {"forward": 2, "backward_data": 0, "backward_filter": 1}[pass_] else v
                    for k, v in enumerate(f32)
                ]
            result = np.empty(out.shape, np.float32)
            ctx = Ctx(xp=np, ops=LaneOps(), algo=host, workspace=scratch)
            conv = HostConv()
            if pass_ == "forward":
                conv.forward(layer, ctx, f32[0], f32[1], result, None)
            elif pass_ == "backward_data":
                conv.backward(layer, ctx, f32[2], None, f32[1], result, None)
            else:
                conv.backward(layer, ctx, f32[2], f32[0], f32[1], None, result)
            if a != 1.0:
                result *= np.float32(a)
            if b != 0.0:
                result += np.float32(b) * out.astype(np.float32)
            out[...] = result.astype(out.dtype)

        self._submit(h, work, f"{pass_}:{algo}")
        return SUCCESS

    def _submit(self, h: Any, work: Any, call: str) -> None:
        from cupy import _state
        from cupy.cuda.stream import stream_of

        self.calls.append(call)
        _state.submit(stream_of(self._get(h)["stream"] or 0), work, ("cudnn", call))

    def cudnnConvolutionForward(self, h, alpha, xd, x, wd, w, conv, algo, ws, ws_size, beta, yd, y) -> int:
        return self._run("forward", h, alpha, beta, algo, ws, ws_size, xd, x, wd, w, yd, y, conv)

    def cudnnConvolutionBackwardData(self, h, alpha, wd, w, dyd, dy, conv, algo, ws, ws_size, beta, dxd, dx) -> int:
        return self._run("backward_data", h, alpha, beta, algo, ws, ws_size, dxd, dx, wd, w, dyd, dy, conv)

    def cudnnConvolutionBackwardFilter(self, h, alpha, xd, x, dyd, dy, conv, algo, ws, ws_size, beta, dwd, dw) -> int:
        return self._run("backward_filter", h, alpha, beta, algo, ws, ws_size, xd, x, dwd, dw, dyd, dy, conv)

    def cudnnConvolutionBackwardBias(self, h, alpha, dyd, dy, beta, dbd, db) -> int:
        self._check_stream(h)
        if self._get(dyd)["dtype"] == BFLOAT16:
            return NOT_SUPPORTED  # as cuDNN 9.19 on an H200 (the GPU check, 2026-11-28)
        g = self._array(dyd, dy)
        out = self._array(dbd, db).reshape(-1)

        def work() -> None:
            out[...] = g.reshape(-1, g.shape[-1]).astype(np.float32).sum(0, dtype=np.float64).astype(out.dtype)

        self._submit(h, work, "backward_bias")
        return SUCCESS

    # -- rankings and searches ---------------------------------------------------------------------------
    def _fill(self, pass_, perf, n, returned, entries) -> int:
        entries = entries[:n]
        for i, (algo, status, t, mem, math) in enumerate(entries):
            perf[i].algo, perf[i].status, perf[i].time, perf[i].memory = algo, status, t, mem
            perf[i].determinism, perf[i].mathType = int(algo in DETERMINISTIC[pass_]), math
        returned[0] = len(entries)
        return SUCCESS

    def _maths(self, pass_: str, algo: int, conv: Any) -> list[int]:
        """The math types cuDNN lists ``algo`` in: tensor-op first where it has tensor-core kernels, then the
        descriptor's own, then FMA."""
        own = self._get(conv)["math"]
        maths = ([TENSOR_OP_MATH] if algo in TENSOR_CORE[pass_] else []) + [own, FMA_MATH]
        return list(dict.fromkeys(maths))

    def _count(self, pass_: str, out: Any) -> int:
        out[0] = MAX_COUNT[pass_]
        return SUCCESS

    def cudnnGetConvolutionForwardAlgorithmMaxCount(self, h, out) -> int:
        return self._count("forward", out)

    def cudnnGetConvolutionBackwardDataAlgorithmMaxCount(self, h, out) -> int:
        return self._count("backward_data", out)

    def cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(self, h, out) -> int:
        return self._count("backward_filter", out)

    def _rank(self, pass_, h, x, w, conv, y, n, returned, perf) -> int:
        if n < 1:
            return BAD_PARAM
        entries = []
        for algo in ALGOS[pass_]:
            status, _, _, need = self._problem(pass_, x, w, conv, y, algo)
            if status == SUCCESS:
                entries += [(algo, SUCCESS, -1.0, need, m) for m in self._maths(pass_, algo, conv)]
        return self._fill(pass_, perf, n, returned, entries)

    def cudnnGetConvolutionForwardAlgorithm_v7(self, h, x, w, conv, y, n, returned, perf) -> int:
        return self._rank("forward", h, x, w, conv, y, n, returned, perf)

    def cudnnGetConvolutionBackwardDataAlgorithm_v7(self, h, w, dy, conv, dx, n, returned, perf) -> int:
        return self._rank("backward_data", h, dx, w, conv, dy, n, returned, perf)

    def cudnnGetConvolutionBackwardFilterAlgorithm_v7(self, h, x, dy, conv, dw, n, returned, perf) -> int:
        return self._rank("backward_filter", h, x, dw, conv, dy, n, returned, perf)

    def _find(self, pass_, h, x, xp, w, wp, conv, y, yp, n, returned, perf, ws, ws_size) -> int:
        if n < 1:
            return BAD_PARAM
        one, zero = self.ffi.new("float *", 1.0), self.ffi.new("float *", 0.0)
        entries, desc = [], self._get(conv)
        own = desc["math"]
        for algo in ALGOS[pass_]:
            status, _, _, need = self._problem(pass_, x, w, conv, y, algo)
            if status != SUCCESS or need > ws_size:
                continue
            for m in self._maths(pass_, algo, conv):
                desc["math"] = m
                t0 = time.perf_counter()
                self._run(pass_, h, one, zero, algo, ws, ws_size, x, xp, w, wp, y, yp, conv)
                seconds = (time.perf_counter() - t0) * 1e3
                entries.append((algo, SUCCESS, seconds * (0.5 if m == TENSOR_OP_MATH else 1.0), need, m))
            desc["math"] = own
        entries.sort(key=lambda e: e[2])
        return self._fill(pass_, perf, n, returned, entries)

    def cudnnFindConvolutionForwardAlgorithmEx(
        self, h, xd, x, wd, w, conv, yd, y, n, returned, perf, ws, ws_size
    ) -> int:
        return self._find("forward", h, xd, x, wd, w, conv, yd, y, n, returned, perf, ws, ws_size)

    def cudnnFindConvolutionBackwardDataAlgorithmEx(
        self, h, wd, w, dyd, dy, conv, dxd, dx, n, returned, perf, ws, ws_size
    ) -> int:
        return self._find("backward_data", h, dxd, dx, wd, w, conv, dyd, dy, n, returned, perf, ws, ws_size)

    def cudnnFindConvolutionBackwardFilterAlgorithmEx(
        self, h, xd, x, dyd, dy, conv, dwd, dw, n, returned, perf, ws, ws_size
    ) -> int:
        return self._find("backward_filter", h, xd, x, dwd, dw, conv, dyd, dy, n, returned, perf, ws, ws_size)
