"""Convolutions through cuDNN's graph API (``vmem.device("cuda:0", conv_api="graph")``): the backend
:class:`GraphConv`, which offers a pass's engine configurations where :class:`~.conv.CudnnConv` offers the
legacy API's algorithms; FP32 only (the CUDA device stages half-precision convolutions when it runs this API)."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, cast

from . import cudnn
from .conv import CudnnConv, _geometry

if TYPE_CHECKING:
    from ..._typing import GpuArray
    from .device import CudaDevice
    from ...graph.program import Program
    from ...nn.conv import Conv2d

__all__ = ["GraphConv", "agreeing"]


class GraphConv(CudnnConv):
    """The same backend through cuDNN's graph API (:mod:`.graph`), chosen by
    ``vmem.device("cuda:0", conv_api="graph")``. A pass's algorithms are the exact-FP32 engine
    configurations cuDNN's heuristics rank for it (the non-deterministic ones left out on a deterministic
    device, those compiled at run time left out: seconds each), the first :attr:`TOP` that build an
    execution plan (if none does, every engine cuDNN has, with its default knobs), named by engine (``e12``; ``e12.1`` for the same engine's next knob choice) in cuDNN's
    order. Plans are built once per geometry, pass and handle (one handle per stream), and run on the
    handle they were built with: the stream whose work is running."""

    #: Engine configurations offered per pass.
    TOP = 6

    def __init__(self, device: CudaDevice):
        super().__init__(device)
        self._plans: dict[tuple, dict[str, Any]] = {}

    def plans(self, layer: "Conv2d", pass_: str, x_shape: tuple[int, ...], y_shape: tuple[int, ...]) -> dict[str, Any]:
        """The pass's plans by name, in cuDNN's ranking, for the current stream's handle (made on first use:
        a plan runs on the handle it was built with)."""
        from . import graph

        handle = self._handle()
        key = (_geometry(layer, x_shape, y_shape), pass_, int(cudnn.ffi().cast("uintptr_t", handle)))
        found = self._plans.get(key)
        if found is not None:
            return found
        conv = graph.ConvPass(pass_, key[0])
        found = self._build(handle, conv.heuristics(handle), conv)
        if not found:  # none of the ranked ones runs here: every engine cuDNN has, with its default knobs
            found = self._build(handle, conv.engines(handle), conv)
        self._plans[key] = found
        return found

    def _build(self, handle: Any, configs: list[Any], owner: Any) -> dict[str, Any]:
        from . import graph

        found: dict[str, Any] = {}
        for cfg in configs:
            if (self.device.deterministic and not cfg.deterministic) or "runtime_compilation" in cfg.behavior:
                continue
            try:
                plan = graph.ExecutionPlan(handle, cfg, owner)  # the plan keeps its operation graph alive
            except cudnn.CudnnError:
                continue
            name, i = f"e{cfg.index}", 0
            while name in found:
                i += 1
                name = f"e{cfg.index}.{i}"
            found[name] = plan
            if len(found) >= self.TOP:
                break
        return found

    def catalog(self, program: Program) -> Program:
        from ...nn.base import physical

        ops = []
        for op in program.ops:
            if op.kind == "conv":
                x_shape, y_shape = physical(op.in_shapes[0]), physical(op.out_shape)
                with self.device.compute_stream.stream:  # the plans the steps run (on the compute stream)
                    layer = cast("Conv2d", op.layer)
                    ws: dict[str, dict[str | None, int]] = {
                        p: {name: plan.workspace for name, plan in self.plans(layer, p, x_shape, y_shape).items()}
                        for p in cudnn.ALGOS
                    }
                missing = [p for p, names in ws.items() if not names]
                if missing:
                    raise cudnn.CudnnError(
                        f"{op.name}: cuDNN's graph API",
                        cudnn.NOT_SUPPORTED,
                        f"no exact FP32 engine builds a plan for {', '.join(missing)}",
                    )
                op = dataclasses.replace(
                    op, algorithms={p: [n for n in names if n is not None] for p, names in ws.items()}, workspace=ws
                )
            ops.append(op)
        return dataclasses.replace(program, ops=ops)

    def _pass(
        self, layer: "Conv2d", pass_: str, algo: str | None, ws: GpuArray, x: GpuArray, w: GpuArray, y: GpuArray
    ) -> None:
        """One pass through its plan (the first in cuDNN's ranking if none is named); roles as in the parent.
        FP32 only: the device stages half-precision convolutions when it runs the graph API."""
        plans = self.plans(layer, pass_, x.shape, y.shape)
        plan = plans[algo] if algo else next(iter(plans.values()))
        if plan.workspace and (ws is None or ws.nbytes < plan.workspace):
            raise ValueError(
                f"layer {layer.label}: {pass_} engine {algo} needs {plan.workspace} bytes of workspace, "
                f"given {0 if ws is None else ws.nbytes}"
            )
        plan.execute(x.data.ptr, w.data.ptr, y.data.ptr, ws.data.ptr if ws is not None else 0)

    def heuristic(
        self, layer: "Conv2d", pass_: str, x_shape: tuple[int, ...], y_shape: tuple[int, ...], dtype: str = "float32"
    ) -> list[str]:
        return list(self.plans(layer, pass_, x_shape, y_shape))

    def find(
        self, layer: "Conv2d", pass_: str, x: GpuArray, w: GpuArray, y: GpuArray, ws: GpuArray
    ) -> list[tuple[str, float, int]]:
        """Each plan of the pass timed by events on the current stream (after a warm-up run). A plan whose
        result's norm is off the others' median by over 1% is left out: on an H100 with cuDNN 9.19 one
        backward-data engine wrote zeros for a 5x5 convolution, and a profile must never choose it."""
        import cupy

        written = {"forward": y, "backward_data": x, "backward_filter": w}[pass_]
        out, norms = [], {}
        for name, plan in self.plans(layer, pass_, x.shape, y.shape).items():
            if plan.workspace and (ws is None or ws.nbytes < plan.workspace):
                continue
            seconds = plan.seconds(x.data.ptr, w.data.ptr, y.data.ptr, ws.data.ptr if ws is not None else 0)
            flat = written.reshape(-1)
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
