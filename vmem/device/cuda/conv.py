"""Convolutions through cuDNN for the CUDA device: the backend Conv2d hands its passes to on a GPU.

The interface is small (``catalog``, ``forward``, ``backward``, ``heuristic``, ``find``), with two implementations:
:class:`CudnnConv` here, cuDNN's legacy API and its algorithms, and :class:`~vmem.device.cuda.graph_conv.GraphConv`,
its graph API and its engines (``conv_api="graph"``). Tensors are stored channels last (NHWC) and filters KRSC, as
on the CPU; FP32 math as the device's ``math`` says (TF32 by default, FMA where exact). fp16 and bf16 maps are
handed to cuDNN as they are stored (pseudo-half: compute type FLOAT, tensor-op math; the graph API alike), the FP32
weights read through a half copy made at the start of the pass's workspace and the weights' gradient written through
a half copy there, then widened into its FP32 buffer (as PyTorch's autocast casts weights for a convolution); the
bias's gradient is summed in FP32 by vmem's column-sum kernels (cuDNN's BackwardBias refuses BFLOAT16 maps). cuDNN's legacy FP32 algorithms for channels last are implicit GEMM only; with the device's
``nchw=True`` each algorithm is also offered on NCHW copies made in its workspace (``nchw.winograd_nonfused``), so
that plans still account for every byte. Descriptors are made once per layer geometry, layout and dtype; one handle per
stream.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, cast

import numpy as np

from ...codecs import native
from . import cudnn
from ..carve import aligned_bytes as _aligned_bytes
from ..carve import carve as _carve
from .conv_search import pointer, rank, search
from .kernels import backend_of

if TYPE_CHECKING:
    from ..._typing import Array
    from ..._typing import CData, GpuArray
    from numpy.typing import DTypeLike
    from .device import CudaDevice
    from ...graph.program import Program
    from ...nn.base import Ctx
    from ...nn.conv import Conv2d

__all__ = ["CudnnConv", "Descs"]


def _geometry(layer: "Conv2d", x_shape: tuple[int, ...], y_shape: tuple[int, ...]) -> tuple:
    """(n, c, h, w, k, (kh, kw), stride, padding, groups, dilation) of a convolution on channels-last shapes."""
    n, h, w, c = x_shape
    _, ho, wo, k = y_shape
    groups = int(getattr(layer, "groups", 1))
    dilation = tuple(getattr(layer, "dilation", (1, 1)))
    return n, c, h, w, k, tuple(layer.kernel_size), tuple(layer.stride), tuple(layer.padding), groups, dilation


class Descs:
    """The descriptors of one convolution geometry (see ``_geometry``), stored ``layout`` (vmem's is NHWC;
    bench/gpu_conv_probe.py also tries NCHW), its data in ``dtype`` on a device whose FP32 math is ``math``
    (the types and math mode: :func:`cudnn.conv_types`)."""

    def __init__(self, geometry: tuple, layout: int = cudnn.NHWC, dtype: str = "float32", math: str = "exact"):
        n, c, h, w, k, (kh, kw), stride, padding, *rest = geometry
        groups, dilation = rest if rest else (1, (1, 1))
        data, compute, math_type = cudnn.conv_types(dtype, math)
        self.layout = layout
        self.x = cudnn.TensorDesc(n, c, h, w, layout, data)
        self.w = cudnn.FilterDesc(k, c // groups, kh, kw, layout, data)  # grouped: C / groups channels a filter
        self.conv = cudnn.ConvDesc(padding, stride, dilation, dtype=compute, math=math_type, groups=groups)
        #: the math types its algorithms may run in, its own first (:func:`cudnn.math_types`)
        self.maths = cudnn.math_types(dtype, math)
        self.y = cudnn.TensorDesc(*cudnn.conv_output_shape(self.x, self.w, self.conv), layout, data)
        self.bias = cudnn.TensorDesc(1, k, 1, 1, layout, data)


class CudnnConv:
    """cuDNN's convolutions on one CUDA device (see the module docstring)."""

    def __init__(self, device: CudaDevice):
        self.device = device
        self._descs: dict[tuple, Descs] = {}
        self._handles: dict[int, cudnn.Handle] = {}
        f = cudnn.ffi()
        self._one, self._zero = f.new("float *", 1.0), f.new("float *", 0.0)

    def close(self) -> None:
        for h in self._handles.values():
            h.close()
        self._handles.clear()

    def _handle(self) -> CData:
        """The handle of the stream whose work is running; outside a launch (the catalog, a profile's
        ranking), the compute stream's: never one bound to the legacy default stream."""
        import cupy

        ptr = cupy.cuda.get_current_stream().ptr or self.device.compute_stream.ptr
        h = self._handles.get(ptr)
        if h is None:
            h = self._handles[ptr] = cudnn.Handle(ptr)
        return h.ptr

    def descs(
        self,
        layer: "Conv2d",
        x_shape: tuple[int, ...],
        y_shape: tuple[int, ...],
        layout: int = cudnn.NHWC,
        dtype: str = "float32",
    ) -> Descs:
        """The descriptors of ``layer``'s convolution on maps of these channels-last shapes stored in ``dtype``
        (made once per geometry, layout and dtype)."""
        key = (_geometry(layer, x_shape, y_shape), layout, dtype)
        d = self._descs.get(key)
        if d is None:
            d = self._descs[key] = Descs(key[0], layout, dtype, self.math)
        return d

    @property
    def math(self) -> str:
        """How FP32 convolutions compute: the device's ``spec.math`` (exact where it says none)."""
        return str(getattr(getattr(self.device, "spec", None), "math", "exact"))

    @property
    def nchw(self) -> bool:
        """Whether each algorithm is also offered in NCHW (the device's ``nchw=True``)."""
        return bool(getattr(self.device, "nchw", False))

    @property
    def ranked_top(self) -> int:
        """How many of :meth:`heuristic`'s algorithms per pass a profile times (more with both layouts): the
        best of cuDNN's ranking, as the others can run for seconds each on a large batch."""
        return 6 if self.nchw else 3

    # -- the catalog: which algorithms run, and their workspace ----------------------------------------
    def workspace(self, d: Descs, pass_: str, algo: str) -> int | None:
        """Bytes of workspace ``algo`` (an algorithm, ``@`` its math type where not the descriptor's own)
        needs for ``pass_``, or None if cuDNN does not support it here."""
        lib, f = cudnn.lib(), cudnn.ffi()
        size = f.new("size_t *")
        name, math_type = cudnn.unpair(algo)
        index = cudnn.ALGOS[pass_].index(name)
        d.conv.set_math(math_type)
        h = self._handle()
        if pass_ == "forward":
            status = lib.cudnnGetConvolutionForwardWorkspaceSize(h, d.x.ptr, d.w.ptr, d.conv.ptr, d.y.ptr, index, size)
        elif pass_ == "backward_data":
            status = lib.cudnnGetConvolutionBackwardDataWorkspaceSize(
                h, d.w.ptr, d.y.ptr, d.conv.ptr, d.x.ptr, index, size
            )
        else:
            status = lib.cudnnGetConvolutionBackwardFilterWorkspaceSize(
                h, d.x.ptr, d.y.ptr, d.conv.ptr, d.w.ptr, index, size
            )
        return int(size[0]) if status == cudnn.SUCCESS else None

    def catalog(self, program: Program) -> Program:
        """``program`` whose convolutions offer the cuDNN algorithms this GPU supports for them (without the
        non-deterministic ones on a deterministic device), each in every math type the device's mode allows
        (:func:`cudnn.math_types`: ``implicit_precomp_gemm`` in the descriptor's own, ``...@fma`` in FMA),
        with their exact workspace sizes."""
        from ...nn.base import physical

        ops = []
        for op in program.ops:
            if op.kind == "conv":
                x_shape, y_shape = physical(op.in_shapes[0]), physical(op.out_shape)
                dtype = op.dtype.name  # what the op computes in: its storage dtype unless staged to FP32
                layer = cast("Conv2d", op.layer)
                d = self.descs(layer, x_shape, y_shape, cudnn.NHWC, dtype)
                algos: dict[str, list[str]] = {}
                ws: dict[str, dict[str | None, int]] = {}
                w_shape = op.params["weight"].shape
                bias = op.params["bias"].shape[0] if "bias" in op.params else 0
                nchw = self.nchw and op.dtype.itemsize >= 4  # tensor-core types: channels last is cuDNN's own
                if nchw:  # the same algorithms on NCHW copies, which the workspace holds too
                    d_nchw = self.descs(layer, x_shape, y_shape, cudnn.NCHW, dtype)
                    staged = _staging_bytes(op.dtype.itemsize, x_shape, w_shape, y_shape)
                for pass_, names in cudnn.ALGOS.items():
                    skip = cudnn.NONDETERMINISTIC.get(pass_, set()) if self.device.deterministic else set()
                    copies = _weight_copy_bytes(pass_, op.dtype, w_shape, bias)
                    pairs = [cudnn.pair(a, m, d.conv.own) for a in names if a not in skip for m in d.maths]
                    sizes = {a: None if (n := self.workspace(d, pass_, a)) is None else copies + n for a in pairs}
                    if nchw:
                        for a in pairs:
                            size = self.workspace(d_nchw, pass_, a)
                            sizes[NCHW + a] = None if size is None else copies + staged + size
                    fits = {a: s for a, s in sizes.items() if s is not None}
                    ws[pass_] = {a: s for a, s in fits.items()}
                    algos[pass_] = list(fits)
                op = dataclasses.replace(op, algorithms=algos, workspace=ws)
            ops.append(op)
        return dataclasses.replace(program, ops=ops)

    # -- the passes ------------------------------------------------------------------------------------
    _ptr = staticmethod(pointer)

    @staticmethod
    def _ws(ws: GpuArray) -> tuple[CData, int]:
        return (CudnnConv._ptr(ws), int(ws.nbytes)) if ws is not None and ws.nbytes else (cudnn.ffi().NULL, 0)

    def forward(self, layer: "Conv2d", ctx: "Ctx", x: GpuArray, w: GpuArray, y: GpuArray, b: Array = None) -> None:
        """``y = conv(x, w)``, then the bias ``b`` added where given, and with ``ctx.relu`` the ReLU in the
        same kernel. Half-precision maps read FP32 weights through a half copy at the start of the
        workspace."""
        ws = ctx.workspace
        if x.dtype != w.dtype:
            (wh,), ws = _carve(ws, x.dtype, w.shape)
            wh[...] = w
            w = wh
        algo = ctx.algo[0] if isinstance(ctx.algo, tuple) else ctx.algo  # a forward's algorithm is one name
        self._pass(layer, "forward", algo, ws, x, w, y)
        if b is not None:  # one pass of vmem's kernel (CuPy's broadcast add divides 64-bit indices per value)
            (native.bias_relu if ctx.relu else native.bias_add)(y, b, backend_of(y))  # the ReLU after it too
        elif ctx.relu:
            native.relu(y, y, backend_of(y))

    def backward(
        self,
        layer: "Conv2d",
        ctx: "Ctx",
        dy: GpuArray,
        x: GpuArray | None,
        w: GpuArray,
        dx: GpuArray | None,
        dw: GpuArray | None,
        db: GpuArray | None = None,
    ) -> None:
        """The bias's gradient ``db`` if given (cuDNN's own reduction of ``dy``: a generic column sum over
        N*H*W rows is many times slower), backward-filter if ``dw`` is wanted, then backward-data if ``dx``
        is (one after the other in one workspace; a split backward makes them two calls). Half-precision
        maps: the weights read through a half copy, the filters' gradient written through a half copy, then
        widened into ``dw`` (FP32), the bias's summed in FP32 by vmem's kernels; the copies are carved alike
        in either call."""
        ws, wide = ctx.workspace, None
        if dy.dtype != w.dtype:
            (wh, dwh), ws = _carve(ws, dy.dtype, w.shape, w.shape)
            if db is not None:  # the bias's gradient, in FP32 straight from the half map (vmem's kernels)
                (partial,), ws = _carve(ws, np.float32, (native.COLUMN_GROUPS * db.shape[0],))
                native.column_sum(dy, db, partial, backend_of(dy))
                db = None
            if dx is not None:
                wh[...] = w
            if dw is not None:
                wide = (dw, dwh)
                dw = dwh
            w = wh
        if db is not None:  # FP32: cuDNN's own reduction (it takes no BFLOAT16 maps: CUDNN_STATUS_NOT_SUPPORTED)
            assert x is not None
            d = self.descs(layer, x.shape, dy.shape, cudnn.NHWC, np.dtype(dy.dtype).name)
            cudnn.check(
                "cudnnConvolutionBackwardBias",
                cudnn.lib().cudnnConvolutionBackwardBias(
                    self._handle(), self._one, d.y.ptr, self._ptr(dy), self._zero, d.bias.ptr, self._ptr(db)
                ),
            )
        data_algo, filter_algo = ctx.algo if isinstance(ctx.algo, tuple) else (ctx.algo, ctx.algo)
        if dw is not None:
            assert x is not None, f"layer {layer.label}: the filters' gradient reads the input"
            self._pass(layer, "backward_filter", filter_algo, ws, x, dw, dy)
        if dx is not None:
            self._pass(layer, "backward_data", data_algo, ws, dx, w, dy)
        if wide is not None:
            dw32, dwh = wide
            dw32[...] = dwh

    #: The algorithm a pass runs when none is named.
    _DEFAULT = {"forward": "implicit_gemm", "backward_data": "algo_1", "backward_filter": "algo_1"}

    def _pass(
        self, layer: "Conv2d", pass_: str, algo: str | None, ws: GpuArray, x: GpuArray, w: GpuArray, y: GpuArray
    ) -> None:
        """One pass on channels-last arrays of one dtype, by role: ``x`` the image (dx for backward-data),
        ``w`` the filters (dw for backward-filter), ``y`` the response (dy for the backward passes); ``ws``
        the pass's workspace (a uint8 array, or None). An ``nchw.`` algorithm runs on NCHW copies at the
        start of the workspace (filters KCRS), its result copied back."""
        algo = algo or self._DEFAULT[pass_]
        dtype = np.dtype(x.dtype)
        if not algo.startswith(NCHW):
            self._call(pass_, self.descs(layer, x.shape, y.shape, cudnn.NHWC, dtype.name), algo, x, w, y, *self._ws(ws))
            return
        staged = _staging_bytes(dtype.itemsize, x.shape, w.shape, y.shape)
        if ws is None or ws.nbytes < staged:
            raise ValueError(
                f"layer {layer.label}: {pass_} {algo} needs at least {staged} bytes of workspace for "
                f"its NCHW copies, given {0 if ws is None else ws.nbytes}"
            )
        (xt, wt, yt), rest = _carve(ws, dtype, *(_nchw_shape(s) for s in (x.shape, w.shape, y.shape)))
        copies = {"x": (x, xt), "w": (w, wt), "y": (y, yt)}
        reads, writes = {"forward": ("xw", "y"), "backward_filter": ("xy", "w"), "backward_data": ("wy", "x")}[pass_]
        for role in reads:
            src, dst = copies[role]
            dst[...] = src.transpose(0, 3, 1, 2)  # NHWC -> NCHW (filters KRSC -> KCRS)
        d = self.descs(layer, x.shape, y.shape, cudnn.NCHW, dtype.name)
        self._call(pass_, d, algo[len(NCHW) :], xt, wt, yt, *self._ws(rest))
        out, result = copies[writes]
        out[...] = result.transpose(0, 2, 3, 1)  # back to NHWC (KRSC)

    def _call(
        self, pass_: str, d: Descs, algo: str, x: GpuArray, w: GpuArray, y: GpuArray, ws: GpuArray, ws_size: int
    ) -> None:
        lib, h, ptr = cudnn.lib(), self._handle(), self._ptr
        name, math_type = cudnn.unpair(algo)
        index = cudnn.ALGOS[pass_].index(name)
        d.conv.set_math(math_type)  # the pair's math type on the descriptor before the call, as PyTorch does
        if pass_ == "forward":
            cudnn.check(
                "cudnnConvolutionForward",
                lib.cudnnConvolutionForward(
                    h,
                    self._one,
                    d.x.ptr,
                    ptr(x),
                    d.w.ptr,
                    ptr(w),
                    d.conv.ptr,
                    index,
                    ws,
                    ws_size,
                    self._zero,
                    d.y.ptr,
                    ptr(y),
                ),
            )
        elif pass_ == "backward_filter":
            cudnn.check(
                "cudnnConvolutionBackwardFilter",
                lib.cudnnConvolutionBackwardFilter(
                    h,
                    self._one,
                    d.x.ptr,
                    ptr(x),
                    d.y.ptr,
                    ptr(y),
                    d.conv.ptr,
                    index,
                    ws,
                    ws_size,
                    self._zero,
                    d.w.ptr,
                    ptr(w),
                ),
            )
        else:
            cudnn.check(
                "cudnnConvolutionBackwardData",
                lib.cudnnConvolutionBackwardData(
                    h,
                    self._one,
                    d.w.ptr,
                    ptr(w),
                    d.y.ptr,
                    ptr(y),
                    d.conv.ptr,
                    index,
                    ws,
                    ws_size,
                    self._zero,
                    d.x.ptr,
                    ptr(x),
                ),
            )

    def heuristic(
        self, layer: "Conv2d", pass_: str, x_shape: tuple[int, ...], y_shape: tuple[int, ...], dtype: str = "float32"
    ) -> list[str]:
        """cuDNN's ranking of ``pass_``'s algorithms for this geometry and dtype, best first, without running
        them (``Get*Algorithm_v7``); only those it reports as supported. With NCHW variants, the two layouts'
        rankings alternate, channels last first (FP32 only: half precision runs channels last, the layout its
        tensor-core kernels are written for)."""
        ranked = self._ranked(layer, pass_, x_shape, y_shape, cudnn.NHWC, dtype)
        if not self.nchw or np.dtype(dtype).itemsize < 4:
            return ranked
        other = [NCHW + a for a in self._ranked(layer, pass_, x_shape, y_shape, cudnn.NCHW, dtype)]
        merged = [a for pair in zip(ranked, other) for a in pair]
        return merged + ranked[len(other) :] + other[len(ranked) :]

    def _ranked(
        self, layer: "Conv2d", pass_: str, x_shape: tuple[int, ...], y_shape: tuple[int, ...], layout: int, dtype: str
    ) -> list[str]:
        d = self.descs(layer, x_shape, y_shape, layout, dtype)
        return list(dict.fromkeys(name for name, _, _ in rank(self._handle(), pass_, d, self.device.deterministic)))

    def find(
        self, layer: "Conv2d", pass_: str, x: GpuArray, w: GpuArray, y: GpuArray, ws: GpuArray
    ) -> list[tuple[str, float, int]]:
        """cuDNN's own measurement (``Find*Ex``) of every algorithm of ``pass_`` on these buffers: (name,
        seconds, workspace bytes), fastest first; ``y`` is dy for the backward passes. FP32 weights beside
        half maps are searched on a half copy (the workspace each pass's copies take is the catalog's)."""
        dtype = np.dtype(x.dtype)
        if w.dtype != dtype:
            w = w.astype(dtype)  # a few MB outside the arena, while profiling only
        det = bool(self.device.deterministic)
        d = self.descs(layer, x.shape, y.shape, cudnn.NHWC, dtype.name)
        found = search(self._handle(), pass_, d, x, w, y, ws, det)
        if self.nchw and dtype.itemsize >= 4:  # timed on the same bytes read as NCHW: cuDNN's time, without the copies
            staged = _staging_bytes(dtype.itemsize, x.shape, w.shape, y.shape)
            d = self.descs(layer, x.shape, y.shape, cudnn.NCHW, dtype.name)
            nchw = search(self._handle(), pass_, d, x, w, y, ws, det)
            found = sorted(found + [(NCHW + a, t, m + staged) for a, t, m in nchw], key=lambda r: r[1])
        return found


#: Prefix of the algorithms run on NCHW copies (``nchw.winograd_nonfused``).
NCHW = "nchw."


def _nchw_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    n, h, w, c = shape
    return (n, c, h, w)


def _staging_bytes(itemsize: int, *shapes: tuple[int, ...]) -> int:
    """Workspace bytes of the NCHW copies of tensors of (channels-last) ``shapes``, each aligned."""
    return sum(_aligned_bytes(s, itemsize) for s in shapes)


def _weight_copy_bytes(pass_: str, dtype: DTypeLike, w_shape: tuple[int, ...], bias: int) -> int:
    """Workspace bytes of the half copies a pass over ``dtype`` maps makes of FP32 weights (none for FP32):
    the weights forward; the weights, their gradient and the bias's gradient backward (both backward
    passes run in one workspace), and the FP32 partial sums of the bias's gradient
    (:func:`vmem.codecs.native.column_sum`)."""
    itemsize = np.dtype(dtype).itemsize
    if itemsize >= 4:
        return 0
    w = _aligned_bytes(w_shape, itemsize)
    partial = _aligned_bytes((native.COLUMN_GROUPS * bias,), 4) if bias else 0
    return w if pass_ == "forward" else 2 * w + partial
