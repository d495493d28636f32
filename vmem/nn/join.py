"""Joins of branches: Add (residual connections) and Concat (inception modules, on channels)."""

from __future__ import annotations

from typing import Sequence, TYPE_CHECKING

from ..errors import ShapeError
from .base import Ctx, Layer, Shape

if TYPE_CHECKING:
    from .._typing import Array

__all__ = ["Add", "Concat"]


class Add(Layer):
    """Element-wise sum of two or more inputs of the same rank, broadcasting axes of length 1 (the batch axis
    included: a (1, T, F) input adds to every sample). Backward needs nothing; an input's gradient is the
    output's, summed over the axes it was broadcast along."""

    kind = "add"
    arity = None

    def output_shape(self, in_shapes: Sequence[Shape]) -> Shape:
        self.check_arity(in_shapes)
        out = list(in_shapes[0])
        for other in in_shapes[1:]:
            if len(other) != len(out) or any(a != b and 1 not in (a, b) for a, b in zip(out, other)):
                raise ShapeError(f"layer {self.label}: cannot add shapes {tuple(in_shapes[0])} and {tuple(other)}")
            out = [max(a, b) for a, b in zip(out, other)]
        return tuple(out)

    def flops(self, in_shapes: Sequence[Shape]) -> int:
        n = 1
        for d in self.output_shape(in_shapes):
            n *= d
        return n * (len(in_shapes) - 1)

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        xp = ctx.xp
        xp.add(xs[0], xs[1], out=y)
        for x in xs[2:]:
            y += x

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        for dx in dxs:
            if dx is None or dx is dy:
                continue
            if dx.shape == dy.shape:
                dx[...] = dy
            else:
                axes = tuple(i for i, (a, b) in enumerate(zip(dx.shape, dy.shape)) if a != b)
                ctx.xp.sum(dy, axis=axes, keepdims=True, out=dx)


class Concat(Layer):
    """``Concat(axis=1)``: concatenation along a logical axis (channels of NCHW by default; any non-batch
    axis of tensors of other ranks). Backward needs nothing."""

    kind = "concat"
    arity = None

    def __init__(self, axis: int = 1):
        super().__init__()
        self.axis = axis

    def extra_repr(self) -> str:
        return "" if self.axis == 1 else f"axis={self.axis}"

    def output_shape(self, in_shapes: Sequence[Shape]) -> Shape:
        self.check_arity(in_shapes)
        first = tuple(in_shapes[0])
        rank = len(first)
        a = self.axis % rank if -rank <= self.axis < rank else -1
        if a < 1 or (rank == 4 and a != 1):
            raise ShapeError(
                f"layer {self.label}: cannot concatenate along axis {self.axis} of {first}"
                + (" (4-D tensors join on channels)" if rank == 4 else "")
            )
        for other in in_shapes[1:]:
            other = tuple(other)
            if len(other) != rank or other[:a] + other[a + 1 :] != first[:a] + first[a + 1 :]:
                raise ShapeError(f"layer {self.label}: cannot concatenate shapes {first} and {other} on axis {a}")
        return first[:a] + (sum(s[a] for s in in_shapes),) + first[a + 1 :]

    def flops(self, in_shapes: Sequence[Shape]) -> int:
        return 0

    def _stored_axis(self, ndim: int) -> int:
        return ndim - 1 if ndim == 4 else self.axis % ndim  # channels are stored last

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        a = self._stored_axis(y.ndim)
        start = 0
        for x in xs:
            stop = start + x.shape[a]
            y[(slice(None),) * a + (slice(start, stop),)] = x
            start = stop

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        a = self._stored_axis(dy.ndim)
        start = 0
        for dx, shape in zip(dxs, ctx.in_shapes):
            stop = start + shape[a]
            if dx is not None:
                dx[...] = dy[(slice(None),) * a + (slice(start, stop),)]
            start = stop
