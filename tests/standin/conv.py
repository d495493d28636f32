"""cuDNN on the stand-in: the CPU device's convolutions (:class:`vmem.device.hostconv.HostConv`, its
algorithms and workspaces) run on the device arrays' memory, so that an FP32 step on ``CudaDevice``
computes what the CPU device's step computes. Over fp16/bf16 maps they compute as cuDNN's pseudo-half
does: half data and half weights read into FP32, FP32 arithmetic, each output rounded once to half (the
weights' gradient through half, as cuDNN writes it into the half copy; the bias's summed in FP32, as
vmem's column kernels do)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from vmem.device.hostconv import HostConv
from vmem.device.lanes import LaneOps


def _host(x: Any) -> Any:
    from cupy import ndarray

    if x is None:
        return None
    if not isinstance(x, ndarray):
        raise TypeError(f"cuDNN takes device pointers: given {type(x).__name__}")
    return x._a


def _through(a: np.ndarray, half: Any) -> np.ndarray:
    """``a`` rounded to ``half`` and read back in FP32."""
    return a.astype(half).astype(np.float32)


class StandinConv:
    """The device's convolution backend (``ConvBackend``) on the stand-in, one per device."""

    def __init__(self) -> None:
        self.host = HostConv()
        self.ranked_top = self.host.ranked_top
        self.ops = LaneOps()
        self.calls: list[str] = []

    @classmethod
    def of(cls, device: Any) -> "StandinConv":
        if device._conv is None:
            device._conv = cls()
        return device._conv

    def _ctx(self, ctx: Any) -> Any:
        return dataclasses.replace(ctx, ops=self.ops, workspace=_host(ctx.workspace))

    def catalog(self, program: Any) -> Any:
        return self.host.catalog(program)

    def forward(self, layer: Any, ctx: Any, x: Any, w: Any, y: Any, b: Any = None) -> None:
        self.calls.append("forward")
        x, w, y, b = _host(x), _host(w), _host(y), _host(b)
        if x.dtype == np.float32:
            return self.host.forward(layer, self._ctx(ctx), x, w, y, b)
        y32 = np.empty(y.shape, np.float32)
        self.host.forward(layer, self._half_ctx(ctx), x.astype(np.float32), _through(w, x.dtype), y32, None)
        y[...] = y32.astype(y.dtype)
        if b is not None:  # vmem's bias kernel: the half output widened, the FP32 bias added, rounded once
            y[...] = (y.astype(np.float32) + b).astype(y.dtype)

    def backward(self, layer: Any, ctx: Any, dy: Any, x: Any, w: Any, dx: Any, dw: Any, db: Any = None) -> None:
        self.calls.append("backward")
        dy, x, w, dx, dw, db = (_host(a) for a in (dy, x, w, dx, dw, db))
        if dy.dtype == np.float32:
            return self.host.backward(layer, self._ctx(ctx), dy, x, w, dx, dw, db)
        half = dy.dtype
        dx32 = None if dx is None else np.empty(dx.shape, np.float32)
        dw32 = None if dw is None else np.empty(dw.shape, np.float32)
        x32 = None if x is None else x.astype(np.float32)
        self.host.backward(layer, self._half_ctx(ctx), dy.astype(np.float32), x32, _through(w, half), dx32, dw32, None)
        if db is not None:
            db[...] = dy.reshape(-1, dy.shape[-1]).astype(np.float32).sum(0, dtype=np.float64).astype(np.float32)
        if dw is not None:
            dw[...] = _through(dw32, half)
        if dx is not None:
            dx[...] = dx32.astype(half)

    def _half_ctx(self, ctx: Any) -> Any:
        """The pass's context for FP32 copies of half maps: the workspace twice as long (host scratch: the
        host's algorithms carve it in the maps' type, sized for half)."""
        ws = ctx.workspace
        return dataclasses.replace(
            ctx, ops=self.ops, workspace=np.zeros(2 * (0 if ws is None else ws.nbytes) + 4096, np.uint8)
        )

    def heuristic(self, layer: Any, pass_: str, x_shape: tuple, y_shape: tuple, dtype: str = "float32") -> list:
        return self.host.heuristic(layer, pass_, x_shape, y_shape, dtype)

    def find(self, layer: Any, pass_: str, x: Any, w: Any, y: Any, ws: Any) -> list:
        return self.host.find(layer, pass_, _host(x), _host(w), _host(y), _host(ws))

    def close(self) -> None:
        pass
