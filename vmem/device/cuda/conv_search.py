"""cuDNN's ranking (``Get*Algorithm_v7``) and search (``Find*Ex``) of a convolution pass's algorithms.

Both return cuDNN's performance records: one per (algorithm, math type) pair it supports, as many as
``Get*AlgorithmMaxCount`` says it can return. Each is read into (name, seconds, workspace bytes), the name
an (algorithm, math type) pair as :func:`vmem.device.cuda.cudnn.pair` writes it; records that did not run,
in a math type the device's mode does not allow (TF32 on an exact device), or, on a deterministic device,
those cuDNN marks as not deterministic, are left out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import cudnn

if TYPE_CHECKING:
    from ..._typing import CData, GpuArray
    from .conv import Descs

__all__ = ["max_count", "pointer", "rank", "search"]

#: The C type of each pass's performance records.
_PERF = {
    "forward": "cudnnConvolutionFwdAlgoPerf_t",
    "backward_data": "cudnnConvolutionBwdDataAlgoPerf_t",
    "backward_filter": "cudnnConvolutionBwdFilterAlgoPerf_t",
}

#: One found entry: (algorithm@math name, seconds, workspace bytes).
Found = tuple[str, float, int]


def max_count(handle: CData, pass_: str) -> int:
    """How many results cuDNN's ranking or search of ``pass_`` can return (``Get*AlgorithmMaxCount``): an
    algorithm once per math type it runs in."""
    lib, f = cudnn.lib(), cudnn.ffi()
    count = f.new("int *")
    call = {
        "forward": lib.cudnnGetConvolutionForwardAlgorithmMaxCount,
        "backward_data": lib.cudnnGetConvolutionBackwardDataAlgorithmMaxCount,
        "backward_filter": lib.cudnnGetConvolutionBackwardFilterAlgorithmMaxCount,
    }[pass_]
    cudnn.check(f"cudnnGet*AlgorithmMaxCount({pass_})", call(handle, count))
    return max(int(count[0]), 1)


def _records(handle: CData, pass_: str, d: Descs) -> tuple[CData, CData, int]:
    """An empty array of ``pass_``'s records as long as cuDNN can fill, the count it writes, and that
    length; the descriptor back in its own math type (each record names the math type it ran in)."""
    f = cudnn.ffi()
    d.conv.set_math(None)
    n = max_count(handle, pass_)
    return f.new(f"{_PERF[pass_]}[{n}]"), f.new("int *"), n


def _read(perf: CData, returned: CData, pass_: str, d: Descs, deterministic: bool) -> list[Found]:
    """The records that ran, in cuDNN's order, as the module docstring says."""
    names, out = cudnn.ALGOS[pass_], []
    for p in perf[0 : returned[0]]:
        if p.status != cudnn.SUCCESS or p.mathType not in d.maths or (deterministic and not p.determinism):
            continue
        out.append((cudnn.pair(names[p.algo], p.mathType, d.conv.own), float(p.time) / 1e3, int(p.memory)))
    return out


def rank(handle: CData, pass_: str, d: Descs, deterministic: bool = False) -> list[Found]:
    """cuDNN's heuristic ranking of ``pass_`` for descriptors ``d``, best first, running nothing."""
    lib = cudnn.lib()
    perf, returned, n = _records(handle, pass_, d)
    if pass_ == "forward":
        status = lib.cudnnGetConvolutionForwardAlgorithm_v7(
            handle, d.x.ptr, d.w.ptr, d.conv.ptr, d.y.ptr, n, returned, perf
        )
    elif pass_ == "backward_data":
        status = lib.cudnnGetConvolutionBackwardDataAlgorithm_v7(
            handle, d.w.ptr, d.y.ptr, d.conv.ptr, d.x.ptr, n, returned, perf
        )
    else:
        status = lib.cudnnGetConvolutionBackwardFilterAlgorithm_v7(
            handle, d.x.ptr, d.y.ptr, d.conv.ptr, d.w.ptr, n, returned, perf
        )
    cudnn.check(f"cudnnGet*Algorithm_v7({pass_})", status)
    return _read(perf, returned, pass_, d, deterministic)


def pointer(a: GpuArray | None) -> CData:
    """The device address of ``a`` as cuDNN takes it (NULL for None)."""
    return cudnn.ffi().cast("void *", a.data.ptr) if a is not None else cudnn.ffi().NULL


def search(
    handle: CData,
    pass_: str,
    d: Descs,
    x: GpuArray,
    w: GpuArray,
    y: GpuArray,
    ws: GpuArray | None,
    deterministic: bool = False,
) -> list[Found]:
    """``Find*Ex`` of ``pass_`` with descriptors ``d`` on the arrays ``x``, ``w``, ``y`` (dx, dw, dy where
    the pass writes them) and the workspace ``ws`` (or None), fastest first; cuDNN may list a pair twice,
    and :func:`vmem.costs.timing.fastest` keeps the faster."""
    lib, f = cudnn.lib(), cudnn.ffi()
    perf, returned, n = _records(handle, pass_, d)
    tail = (pointer(ws), int(ws.nbytes)) if ws is not None else (f.NULL, 0)
    if pass_ == "forward":
        status = lib.cudnnFindConvolutionForwardAlgorithmEx(
            handle, d.x.ptr, pointer(x), d.w.ptr, pointer(w), d.conv.ptr, d.y.ptr, pointer(y), n, returned, perf, *tail
        )
    elif pass_ == "backward_data":
        status = lib.cudnnFindConvolutionBackwardDataAlgorithmEx(
            handle, d.w.ptr, pointer(w), d.y.ptr, pointer(y), d.conv.ptr, d.x.ptr, pointer(x), n, returned, perf, *tail
        )
    else:
        status = lib.cudnnFindConvolutionBackwardFilterAlgorithmEx(
            handle, d.x.ptr, pointer(x), d.y.ptr, pointer(y), d.conv.ptr, d.w.ptr, pointer(w), n, returned, perf, *tail
        )
    cudnn.check(f"cudnnFind({pass_})", status)
    return sorted(_read(perf, returned, pass_, d, deterministic), key=lambda r: r[1])
