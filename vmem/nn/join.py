"""Joins of branches: Add (residual connections), Concat (inception modules, on channels), and Tokens
(learned tokens joined to a sequence: ViT's class token)."""

from __future__ import annotations

from typing import Any, Sequence, TYPE_CHECKING

import numpy as np

from ..errors import ShapeError
from .base import Ctx, Layer, ParamSpec, Shape

if TYPE_CHECKING:
    from .._typing import Array

__all__ = ["Add", "Concat", "Tokens"]


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


class Tokens(Layer):
    """``Tokens(value, axis=1, first=True, trainable=True)``: the input joined along a non-batch ``axis``
    with a block of learned values the same for every sample (ViT's class token, DeiT's class and
    distillation tokens): ``y = concat([value, x])`` along ``axis`` (``[x, value]`` with ``first=False``).
    ``value`` holds no batch axis (a (T, D) block for (N, S, D) inputs). Backward needs nothing: the input's
    gradient is its part of the output's, the value's its part summed over the batch. Not for 4-D maps."""

    kind = "tokens"

    def __init__(self, value: Any, axis: int = 1, first: bool = True, trainable: bool = True):
        super().__init__()
        self.value = np.asarray(value, dtype=np.float64)
        self.axis, self.first, self.trainable = int(axis), bool(first), bool(trainable)

    def extra_repr(self) -> str:
        return f"shape={self.value.shape}, axis={self.axis}" + ("" if self.first else ", first=False")

    def _axis(self, rank: int) -> int:
        return self.axis % rank

    def output_shape(self, in_shapes: Sequence[Shape]) -> Shape:
        self.check_arity(in_shapes)
        x = tuple(in_shapes[0])
        rank = len(x)
        a = self._axis(rank) if -rank <= self.axis < rank else -1
        v = self.value.shape
        if rank == 4 or a < 1 or len(v) != rank - 1 or v[: a - 1] + v[a:] != x[1:a] + x[a + 1 :]:
            raise ShapeError(
                f"layer {self.label}: cannot join tokens of shape {v} to {x} along axis {self.axis}"
                + (" (not 4-D maps)" if rank == 4 else "")
            )
        return x[:a] + (x[a] + v[a - 1],) + x[a + 1 :]

    def param_specs(self, in_shapes: Sequence[Shape]) -> dict[str, ParamSpec]:
        stored = self.value[None]
        return {"value": ParamSpec(stored.shape, "value", trainable=self.trainable, value=stored)}

    def flops(self, in_shapes: Sequence[Shape]) -> int:
        return 0

    def _parts(self, ndim: int, x_len: int) -> tuple[tuple, tuple]:
        """(the value's slice, the input's slice) of the output."""
        a, t = self._axis(ndim), self.value.shape[self._axis(ndim) - 1]
        lead = (slice(None),) * a
        if self.first:
            return lead + (slice(0, t),), lead + (slice(t, t + x_len),)
        return lead + (slice(x_len, x_len + t),), lead + (slice(0, x_len),)

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        x = xs[0]
        at_value, at_x = self._parts(y.ndim, x.shape[self._axis(y.ndim)])
        y[at_value] = ctx.params["value"]  # the same tokens for every sample (broadcast over the batch)
        y[at_x] = x

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        a = self._axis(dy.ndim)
        at_value, at_x = self._parts(dy.ndim, ctx.in_shapes[0][a])
        if self.trainable:
            ctx.grads["value"][...] = ctx.xp.sum(dy[at_value], axis=0, keepdims=True)
        if dxs[0] is not None:
            dxs[0][...] = dy[at_x]
