"""Fully connected layer and Flatten."""

from __future__ import annotations

from typing import Sequence, TYPE_CHECKING

import numpy as np

from ..errors import ShapeError
from .base import Ctx, Layer, ParamSpec, Shape, check_init

if TYPE_CHECKING:
    from .._typing import Array

__all__ = ["Linear", "Flatten"]


class Linear(Layer):
    """``Linear(in_features, out_features, bias=True)``: y = x W^T + b over the last axis, for inputs (N, in)
    or (N, ..., in) of rank other than 4 (a sequence: (N, T, in)). Weight (out, in). Needs its input."""

    kind = "linear"
    needs = frozenset({"x"})

    def __init__(self, in_features: int, out_features: int, bias: bool = True, init: str = "glorot"):
        super().__init__()
        self.init = check_init("Linear", init)
        for name, v in (("in_features", in_features), ("out_features", out_features)):
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"Linear: {name}={v!r} must be a positive int")
        self.in_features = in_features
        self.out_features = out_features
        self.bias = bias

    def extra_repr(self) -> str:
        return (
            f"{self.in_features}, {self.out_features}"
            + ("" if self.bias else ", bias=False")
            + (f", init={self.init!r}" if self.init != "glorot" else "")
        )

    def output_shape(self, in_shapes: Sequence[Shape]) -> Shape:
        self.check_arity(in_shapes)
        shape = tuple(in_shapes[0])
        if len(shape) < 2 or len(shape) == 4:
            self.expect_rank(shape, 2)
        if shape[-1] != self.in_features:
            raise ShapeError(f"layer {self.label}: expects input of shape (N, {self.in_features}), got {tuple(shape)}")
        return shape[:-1] + (self.out_features,)

    def param_specs(self, in_shapes: Sequence[Shape]) -> dict[str, ParamSpec]:
        specs = {
            "weight": ParamSpec((self.out_features, self.in_features), self.init, self.in_features, self.out_features)
        }
        if self.bias:
            specs["bias"] = ParamSpec((self.out_features,), "zeros")
        return specs

    def flops(self, in_shapes: Sequence[Shape]) -> int:
        return 2 * int(np.prod(in_shapes[0][:-1])) * self.in_features * self.out_features

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        bias = ctx.params["bias"] if self.bias else None
        ctx.ops.linear(xs[0], ctx.params["weight"], bias, y, ctx.workspace)

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        x = xs[0]  # type: ignore[index]
        if dy.ndim > 2:
            dy, x = dy.reshape(-1, self.out_features), x.reshape(-1, self.in_features)
        dx = dxs[0].reshape(-1, self.in_features) if dxs[0] is not None else None
        db = ctx.grads["bias"] if self.bias else None
        ctx.ops.linear_backward(dy, x, ctx.params["weight"], dx, ctx.grads["weight"], db, ctx.workspace)


class Flatten(Layer):
    """(N, C, H, W) -> (N, C*H*W). A pure reshape: its output shares its input's memory.

    Features are ordered as the device stores them (channels last: H, W, C).
    """

    kind = "flatten"
    inplace = True

    def output_dtype(self, in_dtypes: Sequence[str], dtype: str) -> str:
        return in_dtypes[0]  # a reshape: the input's values as they are

    def output_shape(self, in_shapes: Sequence[Shape]) -> Shape:
        self.check_arity(in_shapes)
        shape = tuple(in_shapes[0])
        if len(shape) < 2:
            raise ShapeError(f"layer {self.label}: needs a batch axis and features, got shape {shape}")
        return (shape[0], int(np.prod(shape[1:])))

    def flops(self, in_shapes: Sequence[Shape]) -> int:
        return 0

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        x = xs[0]
        if not ctx.xp.may_share_memory(x, y):
            y[...] = x.reshape(y.shape)

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        dx = dxs[0]
        if dx is not None and not ctx.xp.may_share_memory(dx, dy):
            dx[...] = dy.reshape(dx.shape)
