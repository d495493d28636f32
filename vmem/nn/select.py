"""Masks and broadcasts: a constant chosen per element by comparing the input with a threshold (Select: a
padding mask's -inf where a position is padding), and a tensor repeated along axes of length 1 (Expand)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ..errors import ShapeError
from .activation import _size
from .arith import stored_constant
from .base import Ctx, Layer, Shape

if TYPE_CHECKING:
    from .._typing import Array

__all__ = ["Select", "Expand"]


class Select(Layer):
    """``Select(cmp, threshold, if_true, if_false)``: ``if_true`` where ``x cmp threshold`` holds, else
    ``if_false`` (``cmp`` one of ``>``, ``<``, ``>=``, ``<=``, ``==``, ``!=``, or ``isnan`` and ``notnan``,
    which test x alone: ``Select("isnan", 0, 0.0, None)`` is attention's NaN-to-zero; each value a constant, any
    float including infinities, that broadcasts into the input's shape without its batch axis, NumPy's way,
    in its logical layout, or None for x itself). What a model makes of a padding mask: ``Select(">", 0.5,
    -inf, 0.0)``; a bound written out: ``Select("<", lo, lo, None)``. No gradient flows where a constant is
    chosen; where x is, it passes. Backward needs x where one value is x itself, else nothing."""

    kind = "select"
    CMPS = (">", "<", ">=", "<=", "==", "!=", "isnan", "notnan")

    def __init__(self, cmp: str, threshold: float, if_true: Any, if_false: Any):
        super().__init__()
        if cmp not in self.CMPS:
            raise ValueError(f"Select: cmp={cmp!r} is not one of {', '.join(self.CMPS)}")
        if if_true is None and if_false is None:
            raise ValueError("Select: at most one of if_true and if_false may be the input itself (None)")
        self.cmp, self.threshold = cmp, float(threshold)
        self.if_true = None if if_true is None else np.asarray(if_true, dtype=np.float64)
        self.if_false = None if if_false is None else np.asarray(if_false, dtype=np.float64)
        # what backward reads depends on the instance: x where it passes the gradient, else nothing
        self.needs = frozenset({"x"}) if self.if_true is None or self.if_false is None else frozenset()  # type: ignore[misc]

    def extra_repr(self) -> str:
        def show(v: np.ndarray | None) -> str:
            return "x" if v is None else f"{v.item():g}" if v.size == 1 else f"shape={v.shape}"

        test = f"{self.cmp}(x)" if self.cmp in ("isnan", "notnan") else f"x {self.cmp} {self.threshold:g}"
        return f"{test} ? {show(self.if_true)} : {show(self.if_false)}"

    def output_shape(self, in_shapes: Sequence[Shape]) -> Shape:
        self.check_arity(in_shapes)
        shape = tuple(in_shapes[0])
        for v in (a.shape for a in (self.if_true, self.if_false) if a is not None):
            if len(v) > len(shape) or any(b not in (1, a) for a, b in zip(shape[len(shape) - len(v) :], v)):
                raise ShapeError(f"layer {self.label}: a value of shape {v} does not broadcast into {shape}")
            if len(v) == len(shape) and v and v[0] != 1:
                raise ShapeError(f"layer {self.label}: a value of shape {v} varies along the batch axis")
        return shape

    def flops(self, in_shapes: Sequence[Shape]) -> int:
        return _size(in_shapes[0])

    def _value(self, ctx: Ctx, v: np.ndarray, rank: int) -> Array:
        return ctx.xp.asarray(stored_constant(v, rank))

    def _test(self, ctx: Ctx, x: Array) -> Array:
        xp = ctx.xp
        if self.cmp in ("isnan", "notnan"):
            nan = xp.isnan(x)
            return nan if self.cmp == "isnan" else xp.logical_not(nan, out=nan)
        return {
            ">": xp.greater,
            "<": xp.less,
            ">=": xp.greater_equal,
            "<=": xp.less_equal,
            "==": xp.equal,
            "!=": xp.not_equal,
        }[self.cmp](x, x.dtype.type(self.threshold))

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        x = xs[0]
        a, b = (x if v is None else self._value(ctx, v, y.ndim).astype(y.dtype) for v in (self.if_true, self.if_false))
        y[...] = ctx.xp.where(self._test(ctx, x), a, b)

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        dx = dxs[0]
        if dx is None:
            return
        if self.if_true is not None and self.if_false is not None:
            dx.fill(0)
            return
        assert xs is not None  # needs = {"x"}
        passes = self._test(ctx, xs[0]) if self.if_true is None else ~self._test(ctx, xs[0])
        ctx.xp.multiply(dy, passes, out=dx)


class Expand(Layer):
    """``Expand(shape)``: the input repeated along its axes of length 1 to ``shape`` (after the batch axis; each
    of the input's axes 1 or the same), as NumPy broadcasts, into a tensor of a rank other than 4 (vmem stores
    4-D tensors as images). Backward needs nothing: the gradient is summed back over the repeated axes."""

    kind = "expand"

    def __init__(self, shape: Sequence[int]):
        super().__init__()
        self.shape = tuple(int(d) for d in shape)
        if any(d < 1 for d in self.shape):
            raise ValueError(f"Expand: shape={self.shape} must hold positive lengths")

    def extra_repr(self) -> str:
        return f"{self.shape}"

    def output_shape(self, in_shapes: Sequence[Shape]) -> Shape:
        self.check_arity(in_shapes)
        shape = tuple(in_shapes[0])
        out = (shape[0],) + self.shape
        if len(out) != len(shape) or any(a not in (1, b) for a, b in zip(shape[1:], self.shape)):
            raise ShapeError(f"layer {self.label}: cannot expand {shape} to {out} (axes of length 1 only)")
        if len(out) == 4:
            raise ShapeError(f"layer {self.label}: a 4-D output {out} would be stored as an image")
        return out

    def flops(self, in_shapes: Sequence[Shape]) -> int:
        return 0

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        y[...] = xs[0]

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        dx = dxs[0]
        if dx is not None:
            axes = tuple(i for i, (a, b) in enumerate(zip(dx.shape, dy.shape)) if a == 1 and b != 1)
            dx[...] = ctx.xp.sum(dy, axis=axes, keepdims=True) if axes else dy
