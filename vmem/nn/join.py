"""Joins of branches: Add (residual connections) and Concat (inception modules, on channels)."""

from __future__ import annotations

from typing import Any, Sequence

from ..errors import ShapeError
from .base import Ctx, Layer, Shape

__all__ = ["Add", "Concat"]


class Add(Layer):
    """Element-wise sum of two or more inputs of the same shape. Backward needs nothing."""

    kind = "add"
    arity = None

    def output_shape(self, in_shapes: Sequence[Shape]) -> Shape:
        self.check_arity(in_shapes)
        first = tuple(in_shapes[0])
        for other in in_shapes[1:]:
            if tuple(other) != first:
                raise ShapeError(f"layer {self.label}: cannot add shapes {first} and {tuple(other)}")
        return first

    def flops(self, in_shapes: Sequence[Shape]) -> int:
        n = 1
        for d in in_shapes[0]:
            n *= d
        return n * (len(in_shapes) - 1)

    def forward(self, ctx: Ctx, xs: list[Any], y: Any) -> None:
        xp = ctx.xp
        xp.add(xs[0], xs[1], out=y)
        for x in xs[2:]:
            y += x

    def backward(self, ctx: Ctx, dy: Any, xs: list[Any] | None, y: Any | None, dxs: list[Any | None]) -> None:
        for dx in dxs:
            if dx is not None and dx is not dy:
                dx[...] = dy


class Concat(Layer):
    """Concatenation along channels (axis 1 of NCHW, or of (N, features)). Backward needs nothing."""

    kind = "concat"
    arity = None

    def output_shape(self, in_shapes: Sequence[Shape]) -> Shape:
        self.check_arity(in_shapes)
        first = tuple(in_shapes[0])
        for other in in_shapes[1:]:
            other = tuple(other)
            if len(other) != len(first) or other[:1] + other[2:] != first[:1] + first[2:]:
                raise ShapeError(
                    f"layer {self.label}: cannot concatenate shapes {first} and {other} on channels"
                )
        return first[:1] + (sum(s[1] for s in in_shapes),) + first[2:]

    def flops(self, in_shapes: Sequence[Shape]) -> int:
        return 0

    def forward(self, ctx: Ctx, xs: list[Any], y: Any) -> None:
        start = 0
        for x in xs:
            stop = start + x.shape[-1]
            y[..., start:stop] = x
            start = stop

    def backward(self, ctx: Ctx, dy: Any, xs: list[Any] | None, y: Any | None, dxs: list[Any | None]) -> None:
        start = 0
        for dx, shape in zip(dxs, ctx.in_shapes):
            stop = start + shape[-1]
            if dx is not None:
                dx[...] = dy[..., start:stop]
            start = stop
