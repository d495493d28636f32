"""Convolutions through cuDNN's graph API (``vmem.device("cuda:0", conv_api="graph")``): the backend
:class:`GraphConv`, which offers a pass's engine configurations where :class:`~.conv.CudnnConv` offers the
legacy API's algorithms.

Maps in FP32, fp16 and bf16 go to cuDNN as they are stored (half precision with FP32 compute, the FP32
weights read through a half copy at the start of the workspace, as the legacy path does). A convolution
whose output an in-place ReLU overwrites (:meth:`~vmem.graph.program.Program.conv_relus`) runs its
forward as one fused graph, convolution + bias + ReLU (algorithms named ``fused.e<engine>``), where cuDNN
builds a plan for it; otherwise the convolution's engines and vmem's bias+ReLU kernel after it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from . import cudnn
from ..carve import carve
from .conv import CudnnConv, _geometry, _weight_copy_bytes

if TYPE_CHECKING:
    from ..._typing import Array, CData, GpuArray
    from .device import CudaDevice
    from .graph import ConvPass, EngineConfig, ExecutionPlan
    from ...graph.program import Program
    from ...nn.base import Ctx
    from ...nn.conv import Conv2d

__all__ = ["FUSED", "GraphConv", "agreeing"]

#: Prefix of a fused forward's algorithms: convolution, bias and ReLU in one of cuDNN's graphs.
FUSED = "fused."


class GraphConv(CudnnConv):
    """The same backend through cuDNN's graph API (:mod:`.graph`), chosen by
    ``vmem.device("cuda:0", conv_api="graph")``. A pass's algorithms are the engine configurations cuDNN's
    heuristics rank for it that the pass's data and the device's math admit (:func:`.graph.admits`: exact
    FP32 takes no TF32 engine), the non-deterministic ones left out on a deterministic device and those
    compiled at run time left out (seconds each) except for a fused forward, which cuDNN builds only so. In
    exact FP32 the first :attr:`TOP` that build an execution plan are offered (if none does, every engine
    cuDNN has); for tensor-core types (TF32, fp16, bf16) every engine cuDNN has is offered too, after its
    ranked ones: the full search. Engines are named by index (``e12``; ``e12.1`` for the same engine's next
    knob choice) in cuDNN's order. Plans are built once per geometry, dtype, fusion, pass and handle (one
    handle per stream), and run on the handle they were built with: the stream whose work is running."""

    #: Engine configurations offered per pass in exact FP32.
    TOP = 6
    #: Engines compiled at run time offered for a fused forward (each takes seconds to build).
    COMPILED = 2

    def __init__(self, device: CudaDevice):
        super().__init__(device)
        self._plans: dict[tuple, dict[str, Any]] = {}
        #: per convolution layer (by id), what its forward is fused with (set by :meth:`catalog`)
        self._fused: dict[int, frozenset[str]] = {}

    def plans(
        self,
        layer: "Conv2d",
        pass_: str,
        x_shape: tuple[int, ...],
        y_shape: tuple[int, ...],
        dtype: str = "float32",
        fuse: frozenset[str] = frozenset(),
    ) -> dict[str, ExecutionPlan]:
        """The pass's plans by name, in cuDNN's ranking, for the current stream's handle (made on first use:
        a plan runs on the handle it was built with); with ``fuse``, the fused forward's (named
        ``fused.e<engine>``)."""
        from . import graph

        handle = self._handle()
        key = (_geometry(layer, x_shape, y_shape), pass_, dtype, fuse, int(cudnn.ffi().cast("uintptr_t", handle)))
        found = self._plans.get(key)
        if found is not None:
            return found
        conv = graph.ConvPass(pass_, key[0], dtype=dtype, fuse=fuse)
        math_ = self.math

        def admit(cfg: EngineConfig) -> bool:
            return graph.admits(cfg, dtype, math_)

        exact = dtype in ("float32", "float64") and math_ == "exact"
        ranked = conv.heuristics(handle, admit=admit)
        if exact:
            found = self._build(handle, ranked, conv, self.TOP, fuse)
            if not found:  # none of the ranked ones runs here: every engine cuDNN has, with its default knobs
                found = self._build(handle, conv.engines(handle, admit=admit), conv, self.TOP, fuse)
        else:  # tensor cores: the ranked engines, then every other engine cuDNN has (the full search)
            listed = {c.index for c in ranked}
            every = ranked + [c for c in conv.engines(handle, admit=admit) if c.index not in listed]
            found = self._build(handle, every, conv, None, fuse)
        self._plans[key] = found
        return found

    def _build(
        self, handle: CData, configs: list[EngineConfig], owner: ConvPass, top: int | None, fuse: frozenset[str]
    ) -> dict[str, ExecutionPlan]:
        from . import graph

        found: dict[str, ExecutionPlan] = {}
        compiled = 0
        for cfg in configs:
            if self.device.deterministic and not cfg.deterministic:
                continue
            runtime = "runtime_compilation" in cfg.behavior
            if runtime and (not fuse or compiled >= self.COMPILED):
                continue
            try:
                plan = graph.ExecutionPlan(handle, cfg, owner)  # the plan keeps its operation graph alive
            except cudnn.CudnnError:
                continue
            compiled += runtime
            base = f"{FUSED if fuse else ''}e{cfg.index}"
            name, i = base, 0
            while name in found:
                i += 1
                name = f"{base}.{i}"
            found[name] = plan
            if top is not None and len(found) >= top:
                break
        return found

    def _fusion(self, layer: "Conv2d") -> frozenset[str]:
        """What ``layer``'s forward is fused with: the ReLU (and its bias) where the catalog found its output
        overwritten by an in-place ReLU."""
        return self._fused.get(id(layer), frozenset())

    def _forward_plans(self, layer: "Conv2d", x_shape: tuple, y_shape: tuple, dtype: str) -> dict[str, ExecutionPlan]:
        """A forward's plans: the fused graph's where the layer is fused and cuDNN builds one, else the
        convolution's alone."""
        fuse = self._fusion(layer)
        if fuse:
            fused = self.plans(layer, "forward", x_shape, y_shape, dtype, fuse)
            if fused:
                return fused
        return self.plans(layer, "forward", x_shape, y_shape, dtype)

    def catalog(self, program: Program) -> Program:
        from ...nn.base import physical

        relus = program.conv_relus()
        ops = []
        for op in program.ops:
            if op.kind == "conv":
                x_shape, y_shape = physical(op.in_shapes[0]), physical(op.out_shape)
                dtype = op.dtype.name  # what the op computes in: its storage dtype unless staged to FP32
                layer = cast("Conv2d", op.layer)
                bias = op.params["bias"].shape[0] if "bias" in op.params else 0
                if op.index in relus:
                    self._fused[id(layer)] = frozenset({"relu"} | ({"bias"} if bias else set()))
                with self.device.compute_stream.stream:  # the plans the steps run (on the compute stream)
                    found = {
                        p: (
                            self._forward_plans(layer, x_shape, y_shape, dtype)
                            if p == "forward"
                            else self.plans(layer, p, x_shape, y_shape, dtype)
                        )
                        for p in cudnn.ALGOS
                    }
                w_shape = op.params["weight"].shape
                ws: dict[str, dict[str | None, int]] = {
                    p: {
                        name: _weight_copy_bytes(p, op.dtype, w_shape, bias) + plan.workspace
                        for name, plan in plans.items()
                    }
                    for p, plans in found.items()
                }
                missing = [p for p, names in ws.items() if not names]
                if missing:
                    raise cudnn.CudnnError(
                        f"{op.name}: cuDNN's graph API",
                        cudnn.NOT_SUPPORTED,
                        f"no {dtype} engine ({self.math} math) builds a plan for {', '.join(missing)}",
                    )
                op = dataclasses.replace(
                    op, algorithms={p: [n for n in names if n is not None] for p, names in ws.items()}, workspace=ws
                )
            ops.append(op)
        return dataclasses.replace(program, ops=ops)

    def forward(self, layer: "Conv2d", ctx: "Ctx", x: GpuArray, w: GpuArray, y: GpuArray, b: Array = None) -> None:
        """``y = conv(x, w)`` (+ ``b``, then the ReLU with ``ctx.relu``). A fused algorithm runs all three in
        one cuDNN graph, the convolution's result kept in FP32 until it is rounded once into ``y``; it is
        offered only where the step runs the ReLU here, so it applies the ReLU whatever ``ctx.relu`` says
        (a profile times it so: the ReLU's own time, also profiled, is then counted twice, a small
        overestimate of a fused step's, the same for every fused algorithm). Others run as
        :class:`~.conv.CudnnConv` runs them."""
        algo = ctx.algo[0] if isinstance(ctx.algo, tuple) else ctx.algo
        dtype = np.dtype(x.dtype).name
        fuse = self._fusion(layer)
        if algo is None and fuse:  # none named: the first of the forward's own plans, fused where it is
            algo = next(iter(self._forward_plans(layer, x.shape, y.shape, dtype)))
            if not algo.startswith(FUSED):
                ctx = dataclasses.replace(ctx, algo=algo)
        if algo is None or not algo.startswith(FUSED):
            super().forward(layer, ctx, x, w, y, b)
            return
        ws = ctx.workspace
        if x.dtype != w.dtype:
            (wh,), ws = carve(ws, x.dtype, w.shape)
            wh[...] = w
            w = wh
        plan = self.plans(layer, "forward", x.shape, y.shape, dtype, fuse)[algo]
        bias = None
        if "bias" in fuse:
            if b is None:
                raise ValueError(f"layer {layer.label}: its fused forward {algo} adds a bias, and none is given")
            bias = cast("GpuArray", b).data.ptr
        self._run(layer, "forward", algo, plan, ws, x, w, y, bias)

    def _run(
        self,
        layer: "Conv2d",
        pass_: str,
        algo: str | None,
        plan: ExecutionPlan,
        ws: GpuArray,
        x: GpuArray,
        w: GpuArray,
        y: GpuArray,
        b: int | None = None,
    ) -> None:
        if plan.workspace and (ws is None or ws.nbytes < plan.workspace):
            raise ValueError(
                f"layer {layer.label}: {pass_} engine {algo} needs {plan.workspace} bytes of workspace, "
                f"given {0 if ws is None else ws.nbytes}"
            )
        plan.execute(x.data.ptr, w.data.ptr, y.data.ptr, ws.data.ptr if ws is not None else 0, b=b)

    def _pass(
        self, layer: "Conv2d", pass_: str, algo: str | None, ws: GpuArray, x: GpuArray, w: GpuArray, y: GpuArray
    ) -> None:
        """One pass of the convolution alone through its plan (the first in cuDNN's ranking if none is
        named); roles as in the parent."""
        plans = self.plans(layer, pass_, x.shape, y.shape, np.dtype(x.dtype).name)
        plan = plans[algo] if algo else next(iter(plans.values()))
        self._run(layer, pass_, algo, plan, ws, x, w, y)

    def heuristic(
        self, layer: "Conv2d", pass_: str, x_shape: tuple[int, ...], y_shape: tuple[int, ...], dtype: str = "float32"
    ) -> list[str]:
        if pass_ == "forward":
            return list(self._forward_plans(layer, x_shape, y_shape, dtype))
        return list(self.plans(layer, pass_, x_shape, y_shape, dtype))

    def find(
        self, layer: "Conv2d", pass_: str, x: GpuArray, w: GpuArray, y: GpuArray, ws: GpuArray
    ) -> list[tuple[str, float, int]]:
        """Each plan of the pass timed by events on the current stream (after a warm-up run). A plan whose
        result's norm is off the others' median by over 1% is left out: on an H100 with cuDNN 9.19 one
        backward-data engine wrote zeros for a 5x5 convolution, and a profile must never choose it. FP32
        weights beside half maps are searched on a half copy; a fused forward on a bias of zeros."""
        import cupy

        dtype = np.dtype(x.dtype)
        if w.dtype != dtype:
            w = w.astype(dtype)  # a few MB outside the arena, while profiling only
        written = {"forward": y, "backward_data": x, "backward_filter": w}[pass_]
        if pass_ == "forward":
            plans = self._forward_plans(layer, x.shape, y.shape, dtype.name)
        else:
            plans = self.plans(layer, pass_, x.shape, y.shape, dtype.name)
        bias = None
        if any(n.startswith(FUSED) for n in plans) and "bias" in self._fusion(layer):
            bias = cupy.zeros(y.shape[-1], np.float32)
        out, norms = [], {}
        for name, plan in plans.items():
            if plan.workspace and (ws is None or ws.nbytes < plan.workspace):
                continue
            b = bias.data.ptr if bias is not None and name.startswith(FUSED) else None
            seconds = plan.seconds(x.data.ptr, w.data.ptr, y.data.ptr, ws.data.ptr if ws is not None else 0, b=b)
            flat = written.reshape(-1).astype(np.float32)
            norms[name] = math.sqrt(float(cupy.vdot(flat, flat).get()))
            out.append((name, seconds, plan.workspace))
        keep = agreeing(norms)
        return sorted((r for r in out if r[0] in keep), key=lambda r: r[1])


def agreeing(norms: dict[str, float], tolerance: float = 0.01) -> set[str]:
    """The names whose norm is within ``tolerance`` (relative) of the median norm: engines that agree."""
    if not norms:
        return set()
    median = sorted(norms.values())[len(norms) // 2]  # the upper median: of two that differ, the larger
    return {k for k, v in norms.items() if abs(v - median) <= tolerance * max(median, 1e-30)}
