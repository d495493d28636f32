"""Layers for sequence models (LSTMs, attention, transformers): embeddings, splits and reshapes, softmax over an
axis, batched matrix products, layer normalization and a length mask.

Tensors may have any rank; only 4-D image tensors are stored channels-last, so the layers here that take an
``axis`` refuse 4-D inputs (their logical and stored axes differ). Token ids travel as floating-point values
(exact up to 2**24) and are cast to integers where they are read.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..errors import ShapeError
from .base import AuxSpec, Ctx, Layer, ParamSpec, Shape

__all__ = [
    "Embedding",
    "Split",
    "Reshape",
    "ExpandDims",
    "Transpose",
    "Softmax",
    "MatMul",
    "LayerNorm",
    "LengthMask",
    "Identity",
    "Mean",
    "Take",
]


def _size(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _axis(layer: Layer, axis: int, rank: int) -> int:
    if rank == 4:
        raise ShapeError(
            f"layer {layer.label}: works on tensors of rank other than 4 (4-D tensors are stored channels-last)"
        )
    if not -rank <= axis < rank or (axis % rank) == 0:
        raise ShapeError(f"layer {layer.label}: axis {axis} is not a non-batch axis of a rank-{rank} tensor")
    return axis % rank


class Embedding(Layer):
    """``Embedding(num, dim)``: token ids of any shape -> vectors, shape (..., dim). Backward needs only the
    ids (its input), and gives no gradient to them."""

    kind = "embedding"
    needs = frozenset({"x"})
    reads_ids = True

    def __init__(self, num: int, dim: int):
        super().__init__()
        for name, v in (("num", num), ("dim", dim)):
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"Embedding: {name}={v!r} must be a positive int")
        self.num, self.dim = num, dim

    def extra_repr(self) -> str:
        return f"{self.num}, {self.dim}"

    def output_shape(self, in_shapes: Sequence[Shape]) -> Shape:
        self.check_arity(in_shapes)
        if len(in_shapes[0]) + 1 == 4:
            raise ShapeError(f"layer {self.label}: ids of shape {tuple(in_shapes[0])} would make a 4-D output")
        return tuple(in_shapes[0]) + (self.dim,)

    def param_specs(self, in_shapes: Sequence[Shape]) -> dict[str, ParamSpec]:
        return {"weight": ParamSpec((self.num, self.dim), "normal", self.dim, self.dim)}

    def flops(self, in_shapes: Sequence[Shape]) -> int:
        return _size(in_shapes[0]) * self.dim

    def forward(self, ctx: Ctx, xs: list[Any], y: Any) -> None:
        ids = xs[0].astype(int)
        ctx.xp.take(ctx.params["weight"], ids, axis=0, out=y)

    def backward(self, ctx: Ctx, dy: Any, xs: list[Any] | None, y: Any | None, dxs: list[Any | None]) -> None:
        xp, grad = ctx.xp, ctx.grads["weight"]
        grad.fill(0)
        ids = xs[0].astype(int).ravel()  # type: ignore[index]
        xp.add.at(grad, ids, dy.reshape(-1, self.dim))


class Split(Layer):
    """``Split(sections, index, axis=1)``: piece ``index`` of ``sections`` equal pieces along ``axis`` (use
    ``Graph.split(node, sections, axis)`` for all of them). Backward needs nothing."""

    kind = "split"

    def __init__(self, sections: int, index: int, axis: int = 1):
        super().__init__()
        if not isinstance(sections, int) or sections < 1 or not isinstance(index, int) or not 0 <= index < sections:
            raise ValueError(f"Split: index={index!r} must be in [0, sections={sections!r})")
        self.sections, self.index, self.axis = sections, index, axis

    def extra_repr(self) -> str:
        return f"{self.sections}, index={self.index}, axis={self.axis}"

    def output_shape(self, in_shapes: Sequence[Shape]) -> Shape:
        self.check_arity(in_shapes)
        shape = tuple(in_shapes[0])
        a = _axis(self, self.axis, len(shape))
        if shape[a] % self.sections:
            raise ShapeError(f"layer {self.label}: axis {a} of {shape} does not split into {self.sections} pieces")
        return shape[:a] + (shape[a] // self.sections,) + shape[a + 1 :]

    def flops(self, in_shapes: Sequence[Shape]) -> int:
        return 0

    def _slice(self, rank: int, n: int) -> tuple:
        a = self.axis % rank
        return (slice(None),) * a + (slice(self.index * n, (self.index + 1) * n),)

    def forward(self, ctx: Ctx, xs: list[Any], y: Any) -> None:
        a = self.axis % y.ndim
        y[...] = xs[0][self._slice(y.ndim, y.shape[a])]

    def backward(self, ctx: Ctx, dy: Any, xs: list[Any] | None, y: Any | None, dxs: list[Any | None]) -> None:
        dx = dxs[0]
        if dx is None:
            return
        dx.fill(0)
        dx[self._slice(dy.ndim, dy.shape[self.axis % dy.ndim])] = dy


def _logical(a: Any) -> Any:
    """A stored array as its logical layout: a 4-D map (stored (N, H, W, C)) as (N, C, H, W), a view."""
    return a.transpose(0, 3, 1, 2) if a.ndim == 4 else a


class Reshape(Layer):
    """``Reshape(shape)``: the same values, in their logical order, with a new shape after the batch axis. A
    pure view (its output shares its input's memory where the graph allows), except where a side is 4-D:
    a 4-D tensor is stored channels-last, so the values are copied into the other order (how a 4-D tensor
    that is not an image, attention's heads, leaves a network or comes in)."""

    kind = "reshape"
    inplace = True

    def output_dtype(self, in_dtypes: Sequence[str], dtype: str) -> str:
        return in_dtypes[0]  # the input's values as they are

    def __init__(self, shape: Sequence[int]):
        super().__init__()
        self.shape = tuple(int(d) for d in shape)

    def extra_repr(self) -> str:
        return f"{self.shape}"

    def target(self, shape: Shape) -> Shape:
        return self.shape

    def output_shape(self, in_shapes: Sequence[Shape]) -> Shape:
        self.check_arity(in_shapes)
        shape = tuple(in_shapes[0])
        out = (shape[0],) + tuple(self.target(shape))
        if _size(out) != _size(shape) or min(out, default=1) < 1:
            raise ShapeError(f"layer {self.label}: cannot reshape {shape} to {out}")
        return out

    def aliases(self, in_shapes: Sequence[Shape]) -> bool:
        shape = tuple(in_shapes[0])
        return 4 not in (len(shape), len(self.output_shape(in_shapes)))

    def flops(self, in_shapes: Sequence[Shape]) -> int:
        return 0

    def forward(self, ctx: Ctx, xs: list[Any], y: Any) -> None:
        x = xs[0]
        if 4 in (x.ndim, y.ndim):
            _logical(y)[...] = _logical(x).reshape(_logical(y).shape)
        elif not ctx.xp.may_share_memory(x, y):
            y[...] = x.reshape(y.shape)

    def backward(self, ctx: Ctx, dy: Any, xs: list[Any] | None, y: Any | None, dxs: list[Any | None]) -> None:
        dx = dxs[0]
        if dx is None:
            return
        if 4 in (dx.ndim, dy.ndim):
            _logical(dx)[...] = _logical(dy).reshape(_logical(dx).shape)
        elif not ctx.xp.may_share_memory(dx, dy):
            dx[...] = dy.reshape(dx.shape)


class ExpandDims(Reshape):
    """``ExpandDims(axis)``: insert an axis of length 1 at ``axis`` (>= 1)."""

    kind = "reshape"

    def __init__(self, axis: int):
        super().__init__(())
        if not isinstance(axis, int) or axis < 1:
            raise ValueError(f"ExpandDims: axis={axis!r} must be an int >= 1 (after the batch axis)")
        self.axis = axis

    def extra_repr(self) -> str:
        return f"axis={self.axis}"

    def target(self, shape: Shape) -> Shape:
        if self.axis > len(shape):
            raise ShapeError(f"layer {self.label}: axis {self.axis} is past the end of {tuple(shape)}")
        return tuple(shape[1 : self.axis]) + (1,) + tuple(shape[self.axis :])


class Transpose(Layer):
    """``Transpose(perm)``: the axes of the input in the order ``perm`` (logical axes; the batch axis stays
    first: ``perm[0] == 0``), as a copy. A 4-D map is permuted through the channels-last order it is
    stored in. Backward needs nothing: the gradient is permuted back."""

    kind = "transpose"

    def __init__(self, perm: Sequence[int]):
        super().__init__()
        self.perm = tuple(int(a) for a in perm)
        if sorted(self.perm) != list(range(len(self.perm))) or not self.perm or self.perm[0] != 0:
            raise ValueError(f"Transpose: perm={self.perm} must order every axis once, the batch axis first")

    def extra_repr(self) -> str:
        return f"{self.perm}"

    def output_shape(self, in_shapes: Sequence[Shape]) -> Shape:
        self.check_arity(in_shapes)
        shape = tuple(in_shapes[0])
        if len(shape) != len(self.perm):
            raise ShapeError(f"layer {self.label}: perm {self.perm} does not order the axes of {shape}")
        return tuple(shape[a] for a in self.perm)

    def flops(self, in_shapes: Sequence[Shape]) -> int:
        return 0

    def stored(self) -> tuple[int, ...]:
        """The permutation of the stored arrays: for 4-D maps, logical (N, C, H, W) is stored (N, H, W, C)."""
        if len(self.perm) != 4:
            return self.perm
        to_stored, to_logical = (0, 3, 1, 2), (0, 2, 3, 1)  # logical axis -> stored axis, and back
        return tuple(to_stored[self.perm[to_logical[j]]] for j in range(4))

    def forward(self, ctx: Ctx, xs: list[Any], y: Any) -> None:
        y[...] = xs[0].transpose(self.stored())

    def backward(self, ctx: Ctx, dy: Any, xs: list[Any] | None, y: Any | None, dxs: list[Any | None]) -> None:
        dx = dxs[0]
        if dx is not None:
            order = self.stored()
            dx[...] = dy.transpose(tuple(order.index(j) for j in range(len(order))))


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

    def forward(self, ctx: Ctx, xs: list[Any], y: Any) -> None:
        xp, a = ctx.xp, self.axis
        xp.subtract(xs[0], xs[0].max(axis=a, keepdims=True), out=y)
        xp.exp(y, out=y)
        y /= y.sum(axis=a, keepdims=True)

    def backward(self, ctx: Ctx, dy: Any, xs: list[Any] | None, y: Any | None, dxs: list[Any | None]) -> None:
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

    def _b(self, b: Any) -> Any:
        return b.swapaxes(-1, -2) if self.transpose_b else b

    def forward(self, ctx: Ctx, xs: list[Any], y: Any) -> None:
        ctx.ops.matmul(xs[0], self._b(xs[1]), out=y)

    @staticmethod
    def _into(ctx: Ctx, a: Any, b: Any, out: Any) -> None:
        """``a @ b`` into ``out``, summed over the leading axes ``out`` has of length 1 (broadcast in forward)."""
        if a.shape[:-2] == out.shape[:-2] and b.shape[:-2] == out.shape[:-2]:
            ctx.ops.matmul(a, b, out=out)
            return
        full = ctx.xp.matmul(a, b)
        axes = tuple(i for i, (f, o) in enumerate(zip(full.shape[:-2], out.shape[:-2])) if f != o)
        ctx.xp.sum(full, axis=axes, keepdims=True, out=out) if axes else ctx.xp.copyto(out, full)

    def backward(self, ctx: Ctx, dy: Any, xs: list[Any] | None, y: Any | None, dxs: list[Any | None]) -> None:
        a, b = xs  # type: ignore[misc]
        if dxs[0] is not None:
            self._into(ctx, dy, self._b(b).swapaxes(-1, -2), dxs[0])
        if dxs[1] is not None:
            if self.transpose_b:  # dB = dy^T a
                self._into(ctx, dy.swapaxes(-1, -2), a, dxs[1])
            else:
                self._into(ctx, a.swapaxes(-1, -2), dy, dxs[1])


class Identity(Layer):
    """``Identity()``: the input as it is (a model whose output is its input, or a named pass-through). Written
    over its input where the graph allows, else a copy. Backward needs nothing."""

    kind = "identity"
    inplace = True

    def output_dtype(self, in_dtypes: Sequence[str], dtype: str) -> str:
        return in_dtypes[0]

    def flops(self, in_shapes: Sequence[Shape]) -> int:
        return 0

    def forward(self, ctx: Ctx, xs: list[Any], y: Any) -> None:
        if not ctx.xp.may_share_memory(xs[0], y):
            y[...] = xs[0]

    def backward(self, ctx: Ctx, dy: Any, xs: list[Any] | None, y: Any | None, dxs: list[Any | None]) -> None:
        dx = dxs[0]
        if dx is not None and not ctx.xp.may_share_memory(dx, dy):
            dx[...] = dy


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

    def forward(self, ctx: Ctx, xs: list[Any], y: Any) -> None:
        ctx.xp.mean(xs[0], axis=self._axes(y.ndim), keepdims=True, out=y)

    def backward(self, ctx: Ctx, dy: Any, xs: list[Any] | None, y: Any | None, dxs: list[Any | None]) -> None:
        dx = dxs[0]
        if dx is not None:
            count = _size([dx.shape[a] for a in self._axes(dx.ndim)])
            ctx.xp.divide(dy, count, out=dx)  # broadcast over the reduced axes


class Take(Layer):
    """``Take(indices, axis)``: the positions ``indices`` (a list of ints, each in range; repeats allowed) of a
    non-batch ``axis`` of a tensor of rank other than 4, in that order (ONNX's Gather at constant indices).
    Backward needs nothing: the gradient is scattered back, summed where a position is taken twice."""

    kind = "take"

    def __init__(self, indices: Sequence[int], axis: int):
        super().__init__()
        self.indices = tuple(int(i) for i in indices)
        self.axis = int(axis)
        if not self.indices or min(self.indices) < 0:
            raise ValueError(f"Take: indices={indices!r} must be one or more non-negative ints")

    def extra_repr(self) -> str:
        return f"{list(self.indices)}, axis={self.axis}"

    def output_shape(self, in_shapes: Sequence[Shape]) -> Shape:
        self.check_arity(in_shapes)
        shape = tuple(in_shapes[0])
        a = _axis(self, self.axis, len(shape))
        if max(self.indices) >= shape[a]:
            raise ShapeError(f"layer {self.label}: index {max(self.indices)} is past axis {a} of {shape}")
        return shape[:a] + (len(self.indices),) + shape[a + 1 :]

    def flops(self, in_shapes: Sequence[Shape]) -> int:
        return 0

    def forward(self, ctx: Ctx, xs: list[Any], y: Any) -> None:
        xp = ctx.xp
        xp.take(xs[0], xp.asarray(self.indices), axis=self.axis % y.ndim, out=y)

    def backward(self, ctx: Ctx, dy: Any, xs: list[Any] | None, y: Any | None, dxs: list[Any | None]) -> None:
        dx = dxs[0]
        if dx is None:
            return
        xp = ctx.xp
        dx.fill(0)
        a = self.axis % dy.ndim
        xp.add.at(dx, (slice(None),) * a + (xp.asarray(self.indices),), dy)


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

    def forward(self, ctx: Ctx, xs: list[Any], y: Any) -> None:
        xp, f = ctx.xp, self.features
        x2, y2 = xs[0].reshape(-1, f), y.reshape(-1, f)
        mean, invstd = ctx.aux["mean"], ctx.aux["invstd"]
        xp.mean(x2, axis=1, out=mean)
        xp.subtract(x2, mean[:, None], out=y2)
        invstd[...] = 1.0 / xp.sqrt((y2 * y2).mean(axis=1) + self.eps)
        y2 *= invstd[:, None]
        y2 *= ctx.params["weight"]
        y2 += ctx.params["bias"]

    def backward(self, ctx: Ctx, dy: Any, xs: list[Any] | None, y: Any | None, dxs: list[Any | None]) -> None:
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


class LengthMask(Layer):
    """``LengthMask(pad=0, value=-1e4)``: scores (B, T) and token ids (B, T) -> the scores where the id is not
    ``pad``, ``value`` where it is (attention over padded source positions). Backward needs the ids."""

    kind = "lengthmask"
    needs = frozenset({"x"})
    arity = 2

    def __init__(self, pad: int = 0, value: float = -1e4):
        super().__init__()
        self.pad, self.value = int(pad), float(value)

    def output_shape(self, in_shapes: Sequence[Shape]) -> Shape:
        self.check_arity(in_shapes)
        if tuple(in_shapes[0]) != tuple(in_shapes[1]) or len(in_shapes[0]) == 4:
            raise ShapeError(
                f"layer {self.label}: scores {tuple(in_shapes[0])} and ids {tuple(in_shapes[1])} "
                "must have the same shape"
            )
        return tuple(in_shapes[0])

    def forward(self, ctx: Ctx, xs: list[Any], y: Any) -> None:
        ctx.xp.copyto(y, xs[0])
        y[xs[1] == self.pad] = self.value

    def backward(self, ctx: Ctx, dy: Any, xs: list[Any] | None, y: Any | None, dxs: list[Any | None]) -> None:
        if dxs[0] is not None:
            ctx.xp.multiply(dy, xs[1] != self.pad, out=dxs[0])  # type: ignore[index]
        if dxs[1] is not None:
            dxs[1].fill(0)
