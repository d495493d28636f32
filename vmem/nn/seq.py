"""Layers for sequence models (LSTMs, attention, transformers) that move tokens and values: embeddings, splits,
reshapes and transposes, a take along an axis, the identity and a length mask (their arithmetic, softmax,
products, means and layer normalization, is in :mod:`.attention`).

Tensors may have any rank; only 4-D image tensors are stored channels-last, so the layers here that take an
``axis`` refuse 4-D inputs (their logical and stored axes differ). Token ids travel as floating-point values
(exact up to 2**24) and are cast to integers where they are read.
"""

from __future__ import annotations

from typing import Sequence, TYPE_CHECKING

from ..errors import ShapeError
from .base import Ctx, Layer, ParamSpec, Shape

if TYPE_CHECKING:
    from .._typing import Array

__all__ = [
    "Embedding",
    "Split",
    "Reshape",
    "ExpandDims",
    "Transpose",
    "LengthMask",
    "Identity",
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

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        ids = xs[0].astype(int)
        ctx.xp.take(ctx.params["weight"], ids, axis=0, out=y)

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
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

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        a = self.axis % y.ndim
        y[...] = xs[0][self._slice(y.ndim, y.shape[a])]

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        dx = dxs[0]
        if dx is None:
            return
        dx.fill(0)
        dx[self._slice(dy.ndim, dy.shape[self.axis % dy.ndim])] = dy


def _logical(a: Array) -> Array:
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

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        x = xs[0]
        if 4 in (x.ndim, y.ndim):
            _logical(y)[...] = _logical(x).reshape(_logical(y).shape)
        elif not ctx.xp.may_share_memory(x, y):
            y[...] = x.reshape(y.shape)

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
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

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        y[...] = xs[0].transpose(self.stored())

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        dx = dxs[0]
        if dx is not None:
            order = self.stored()
            dx[...] = dy.transpose(tuple(order.index(j) for j in range(len(order))))


class Identity(Layer):
    """``Identity()``: the input as it is (a model whose output is its input, or a named pass-through). Written
    over its input where the graph allows, else a copy. Backward needs nothing."""

    kind = "identity"
    inplace = True

    def output_dtype(self, in_dtypes: Sequence[str], dtype: str) -> str:
        return in_dtypes[0]

    def flops(self, in_shapes: Sequence[Shape]) -> int:
        return 0

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        if not ctx.xp.may_share_memory(xs[0], y):
            y[...] = xs[0]

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        dx = dxs[0]
        if dx is not None and not ctx.xp.may_share_memory(dx, dy):
            dx[...] = dy


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

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        xp = ctx.xp
        xp.take(xs[0], xp.asarray(self.indices), axis=self.axis % y.ndim, out=y)

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        dx = dxs[0]
        if dx is None:
            return
        xp = ctx.xp
        dx.fill(0)
        a = self.axis % dy.ndim
        xp.add.at(dx, (slice(None),) * a + (xp.asarray(self.indices),), dy)


class StepMask(Layer):
    """``StepMask(t)``: step ``t`` of a recurrence over sequences of per-sample lengths: (new, old, lengths) ->
    ``new`` for the samples whose length is more than ``t``, ``old`` for the others (a sample's state stops at
    its last step, and its outputs past it are zeros: ONNX's ``sequence_lens``). ``lengths`` (N,) holds
    integers (kept exact); backward gives ``new`` and ``old`` their samples' gradients, ``lengths`` none."""

    kind = "stepmask"
    needs = frozenset({"x"})
    arity = 3
    id_inputs = (2,)

    def __init__(self, t: int):
        super().__init__()
        self.t = int(t)

    def output_shape(self, in_shapes: Sequence[Shape]) -> Shape:
        self.check_arity(in_shapes)
        new, old, lengths = (tuple(s) for s in in_shapes)
        if new != old or lengths != new[:1]:
            raise ShapeError(
                f"layer {self.label}: the new state {new} and the old {old} must have one shape, and the lengths "
                f"{lengths} one per sample ({new[:1]})"
            )
        return new

    def flops(self, in_shapes: Sequence[Shape]) -> int:
        return 0

    def _mask(self, ctx: Ctx, lengths: Array, ndim: int) -> Array:
        return (lengths > self.t).reshape((-1,) + (1,) * (ndim - 1))

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        ctx.xp.copyto(y, ctx.xp.where(self._mask(ctx, xs[2], y.ndim), xs[0], xs[1]))

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        assert xs is not None
        m = self._mask(ctx, xs[2], dy.ndim)
        if dxs[0] is not None:
            ctx.xp.multiply(dy, m, out=dxs[0])
        if dxs[1] is not None:
            ctx.xp.multiply(dy, ~m, out=dxs[1])
        if dxs[2] is not None:
            dxs[2].fill(0)


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

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        ctx.xp.copyto(y, xs[0])
        y[xs[1] == self.pad] = self.value

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        if dxs[0] is not None:
            ctx.xp.multiply(dy, xs[1] != self.pad, out=dxs[0])  # type: ignore[index]
        if dxs[1] is not None:
            dxs[1].fill(0)
