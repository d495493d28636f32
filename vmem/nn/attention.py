"""The arithmetic of attention and transformers: softmax over an axis, batched matrix products, a mean over an
axis and layer normalization (the layers that move tokens are in :mod:`.seq`, whose conventions these follow:
any rank, 4-D image tensors refused where an ``axis`` is taken)."""

from __future__ import annotations

from typing import Sequence, TYPE_CHECKING

from ..errors import ShapeError
from .base import AuxSpec, Ctx, Layer, ParamSpec, Shape
from .seq import _axis, _size

if TYPE_CHECKING:
    from .._typing import Array

__all__ = ["Softmax", "MatMul", "Mean", "LayerNorm"]


class Softmax(Layer):
    """``Softmax(axis=-1)``: softmax over ``axis``. Backward needs its output."""

    kind = "softmax"
    needs = frozenset({"y"})

    def __init__(self, axis: int = -1):
        super().__init__()
        self.axis = axis

    def output_shape(self, in_shapes: Sequence[Shape]) -> Shape:
        self.check_arity(in_shapes)
        _axis(self, self.axis, len(in_shapes[0]))
        return tuple(in_shapes[0])

    def flops(self, in_shapes: Sequence[Shape]) -> int:
        return 5 * _size(in_shapes[0])

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        xp, a = ctx.xp, self.axis
        xp.subtract(xs[0], xs[0].max(axis=a, keepdims=True), out=y)
        xp.exp(y, out=y)
        y /= y.sum(axis=a, keepdims=True)

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        dx = dxs[0]
        if dx is not None:
            s = (dy * y).sum(axis=self.axis, keepdims=True)
            ctx.xp.multiply(y, dy - s, out=dx)


class MatMul(Layer):
    """``MatMul(transpose_b=False)``: the batched product of (..., M, K) and (..., K, N) (or (..., N, K) with
    ``transpose_b``), inputs of one rank (3 or more, not 4) whose leading axes are equal or 1 (broadcast,
    NumPy's way). Backward needs both inputs; an input's gradient is summed over the axes it was broadcast
    along."""

    kind = "matmul"
    needs = frozenset({"x"})
    arity = 2

    def __init__(self, transpose_b: bool = False):
        super().__init__()
        self.transpose_b = bool(transpose_b)

    def extra_repr(self) -> str:
        return "transpose_b=True" if self.transpose_b else ""

    def output_shape(self, in_shapes: Sequence[Shape]) -> Shape:
        self.check_arity(in_shapes)
        a, b = (tuple(s) for s in in_shapes)
        lead = [max(i, j) for i, j in zip(a[:-2], b[:-2])]
        if (
            len(a) != len(b)
            or len(a) < 3
            or len(a) == 4
            or a[0] != b[0]
            or any(i != j and 1 not in (i, j) for i, j in zip(a[:-2], b[:-2]))
        ):
            raise ShapeError(
                f"layer {self.label}: cannot multiply batches of matrices {a} and {b} (one rank, 3 or more but not "
                "4, leading axes equal or 1)"
            )
        k_b, n = (b[-1], b[-2]) if self.transpose_b else (b[-2], b[-1])
        if a[-1] != k_b:
            raise ShapeError(f"layer {self.label}: inner sizes differ: {a} and {b}")
        return tuple(lead) + (a[-2], n)

    def flops(self, in_shapes: Sequence[Shape]) -> int:
        a = in_shapes[0]
        return 2 * _size(self.output_shape(in_shapes)) * a[-1]

    def _b(self, b: Array) -> Array:
        return b.swapaxes(-1, -2) if self.transpose_b else b

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        ctx.ops.matmul(xs[0], self._b(xs[1]), out=y)

    @staticmethod
    def _into(ctx: Ctx, a: Array, b: Array, out: Array) -> None:
        """``a @ b`` into ``out``, summed over the leading axes ``out`` has of length 1 (broadcast in forward)."""
        if a.shape[:-2] == out.shape[:-2] and b.shape[:-2] == out.shape[:-2]:
            ctx.ops.matmul(a, b, out=out)
            return
        full = ctx.xp.matmul(a, b)
        axes = tuple(i for i, (f, o) in enumerate(zip(full.shape[:-2], out.shape[:-2])) if f != o)
        ctx.xp.sum(full, axis=axes, keepdims=True, out=out) if axes else ctx.xp.copyto(out, full)

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        a, b = xs  # type: ignore[misc]
        if dxs[0] is not None:
            self._into(ctx, dy, self._b(b).swapaxes(-1, -2), dxs[0])
        if dxs[1] is not None:
            if self.transpose_b:  # dB = dy^T a
                self._into(ctx, dy.swapaxes(-1, -2), a, dxs[1])
            else:
                self._into(ctx, a.swapaxes(-1, -2), dy, dxs[1])


class Mean(Layer):
    """``Mean(axes)``: the mean over non-batch ``axes`` of a tensor of rank other than 4, each kept with
    length 1 (reshape after it to drop them; a map's mean over (H, W) is ``AvgPool2d`` over the whole map).
    Backward needs nothing: each input's gradient is its mean's, divided by the count."""

    kind = "mean"

    def __init__(self, axes: Sequence[int]):
        super().__init__()
        self.axes = tuple(int(a) for a in axes)
        if not self.axes or len(set(self.axes)) != len(self.axes):
            raise ValueError(f"Mean: axes={axes!r} must name one or more distinct axes")

    def extra_repr(self) -> str:
        return f"{self.axes}"

    def _axes(self, rank: int) -> tuple[int, ...]:
        return tuple(sorted(_axis(self, a, rank) for a in self.axes))

    def output_shape(self, in_shapes: Sequence[Shape]) -> Shape:
        self.check_arity(in_shapes)
        shape = tuple(in_shapes[0])
        axes = self._axes(len(shape))
        return tuple(1 if i in axes else d for i, d in enumerate(shape))

    def flops(self, in_shapes: Sequence[Shape]) -> int:
        return _size(in_shapes[0])

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        ctx.xp.mean(xs[0], axis=self._axes(y.ndim), keepdims=True, out=y)

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        dx = dxs[0]
        if dx is not None:
            count = _size([dx.shape[a] for a in self._axes(dx.ndim)])
            ctx.xp.divide(dy, count, out=dx)  # broadcast over the reduced axes


class LayerNorm(Layer):
    """``LayerNorm(features, eps=1e-5)``: normalize over the last axis, then scale and shift. Backward needs
    the input and the saved mean and 1/std."""

    kind = "layernorm"
    needs = frozenset({"x"})

    def __init__(self, features: int, eps: float = 1e-5):
        super().__init__()
        if not isinstance(features, int) or features <= 0:
            raise ValueError(f"LayerNorm: features={features!r} must be a positive int")
        self.features, self.eps = features, float(eps)

    def extra_repr(self) -> str:
        return f"{self.features}"

    def output_shape(self, in_shapes: Sequence[Shape]) -> Shape:
        self.check_arity(in_shapes)
        shape = tuple(in_shapes[0])
        if len(shape) == 4 or shape[-1] != self.features:
            raise ShapeError(f"layer {self.label}: expects (..., {self.features}) of rank other than 4, got {shape}")
        return shape

    def param_specs(self, in_shapes: Sequence[Shape]) -> dict[str, ParamSpec]:
        return {"weight": ParamSpec((self.features,), "ones"), "bias": ParamSpec((self.features,), "zeros")}

    def aux_specs(self, in_shapes: Sequence[Shape]) -> dict[str, AuxSpec]:
        rows = (_size(in_shapes[0]) // self.features,)
        return {"mean": AuxSpec(rows, "float"), "invstd": AuxSpec(rows, "float")}

    def flops(self, in_shapes: Sequence[Shape]) -> int:
        return 8 * _size(in_shapes[0])

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        xp, f = ctx.xp, self.features
        x2, y2 = xs[0].reshape(-1, f), y.reshape(-1, f)
        mean, invstd = ctx.aux["mean"], ctx.aux["invstd"]
        xp.mean(x2, axis=1, out=mean)
        xp.subtract(x2, mean[:, None], out=y2)
        invstd[...] = 1.0 / xp.sqrt((y2 * y2).mean(axis=1) + self.eps)
        y2 *= invstd[:, None]
        y2 *= ctx.params["weight"]
        y2 += ctx.params["bias"]

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        xp, f = ctx.xp, self.features
        x2, dy2 = xs[0].reshape(-1, f), dy.reshape(-1, f)  # type: ignore[index]
        mean, invstd = ctx.aux["mean"][:, None], ctx.aux["invstd"][:, None]
        xhat = (x2 - mean) * invstd
        ctx.ops.column_sum(dy2 * xhat, out=ctx.grads["weight"])
        ctx.ops.column_sum(dy2, out=ctx.grads["bias"])
        if dxs[0] is not None:
            g = dy2 * ctx.params["weight"]
            dx = g - g.mean(axis=1, keepdims=True) - xhat * (g * xhat).mean(axis=1, keepdims=True)
            xp.multiply(dx, invstd, out=dxs[0].reshape(-1, f))
