"""Element-wise arithmetic: the product, difference and quotient of two computed tensors (Mul, Sub, Div:
broadcasting axes of length 1), and a tensor combined with a constant (ConstantOp, trainable or not)."""

from __future__ import annotations

from typing import Any, Sequence, TYPE_CHECKING

import numpy as np

from ..errors import ShapeError
from .activation import _size
from .base import Ctx, Layer, ParamSpec, Shape

if TYPE_CHECKING:
    from .._typing import Array
    from .._typing import Xp

__all__ = ["Mul", "Sub", "Div", "ConstantOp", "Power", "stored_constant"]


def _broadcast(a: Shape, b: Shape) -> Shape | None:
    """The shape two inputs of one rank broadcast to (axes of length 1 stretched), None where they do not."""
    if len(a) != len(b) or any(x != y and 1 not in (x, y) for x, y in zip(a, b)):
        return None
    return tuple(max(x, y) for x, y in zip(a, b))


def _summed(xp: Xp, value: Array, dx: Array) -> None:
    """``dx`` = ``value`` summed over the axes ``dx`` was broadcast along (float32 sums accumulated in
    float64, as the column sums are); copied where the shapes agree."""
    if value.shape == dx.shape:
        dx[...] = value
        return
    axes = tuple(i for i, (a, b) in enumerate(zip(dx.shape, value.shape)) if a != b)
    if dx.dtype == np.float32:
        dx[...] = xp.sum(value, axis=axes, keepdims=True, dtype=np.float64)
    else:
        xp.sum(value, axis=axes, keepdims=True, out=dx)


class Mul(Layer):
    """The element-wise product of two inputs of one rank, broadcasting axes of length 1 (a squeeze-and-
    excitation gate (N, C, 1, 1) over its map (N, C, H, W); the batch axis too). Backward needs both inputs;
    a broadcast input's gradient is summed over the axes it was stretched along."""

    kind = "mul"
    needs = frozenset({"x"})
    arity = 2
    verb = "multiply"

    def output_shape(self, in_shapes: Sequence[Shape]) -> Shape:
        self.check_arity(in_shapes)
        out = _broadcast(tuple(in_shapes[0]), tuple(in_shapes[1]))
        if out is None:
            raise ShapeError(
                f"layer {self.label}: cannot {self.verb} shapes {tuple(in_shapes[0])} and "
                f"{tuple(in_shapes[1])} element-wise (they broadcast only along axes of length 1)"
            )
        return out

    def flops(self, in_shapes: Sequence[Shape]) -> int:
        return _size(self.output_shape(in_shapes))

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        ctx.xp.multiply(xs[0], xs[1], out=y)

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        a, b = xs  # type: ignore[misc]
        xp = ctx.xp
        for dx, other in ((dxs[1], a), (dxs[0], b)):  # the second first: the first's may be dy itself
            if dx is None:
                continue
            if dx.shape == dy.shape:
                xp.multiply(dy, other, out=dx)
            else:
                _summed(xp, xp.multiply(dy, other), dx)


class Sub(Mul):
    """The element-wise difference of two inputs of one rank (the first less the second), broadcasting as
    :class:`Mul` does. Backward needs nothing."""

    kind = "sub"
    needs = frozenset()
    verb = "subtract"

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        ctx.xp.subtract(xs[0], xs[1], out=y)

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        xp = ctx.xp
        if dxs[1] is not None:
            if dxs[1].shape == dy.shape:
                xp.negative(dy, out=dxs[1])
            else:
                _summed(xp, xp.negative(dy), dxs[1])
        if dxs[0] is not None and dxs[0] is not dy:
            _summed(xp, dy, dxs[0])


class Div(Mul):
    """The element-wise quotient of two inputs of one rank (the first over the second), broadcasting as
    :class:`Mul` does. Backward needs both inputs."""

    kind = "div"
    verb = "divide"

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        ctx.xp.divide(xs[0], xs[1], out=y)

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        a, b = xs  # type: ignore[misc]
        xp = ctx.xp
        db = dxs[1]
        if db is not None:  # d(a/b)/db = -a / b^2 (before dxs[0], which may be dy itself)
            full = db if db.shape == dy.shape else xp.empty(dy.shape, dy.dtype)
            xp.multiply(dy, a, out=full)
            full /= b
            full /= b
            xp.negative(full, out=full)
            if full is not db:
                _summed(xp, full, db)
        if dxs[0] is not None:
            if dxs[0].shape == dy.shape:
                xp.divide(dy, b, out=dxs[0])
            else:
                _summed(xp, xp.divide(dy, b), dxs[0])


class ConstantOp(Layer):
    """``ConstantOp(op, value, trainable=False)``: the input combined element-wise with a constant: ``add``
    (x + value), ``sub`` (x - value), ``rsub`` (value - x), ``mul`` (x * value) or ``div`` (x / value).
    ``value`` (logical layout, any float array) broadcasts into the input's shape, NumPy's way, and holds no
    batch axis (or one of length 1): a scalar, a per-channel (C, 1, 1) or per-feature bias, a scale. It is a
    buffer of the layer (a parameter ``value`` that is not trained), stored as the input is (channels last
    for a 4-D map); with ``trainable`` it is trained (a learned position table added to a sequence, a layer
    scale multiplying a block's output, a bias added after a MatMul), its gradient summed over the axes it
    broadcasts along. In place where the graph allows; backward needs nothing but the constant, and the
    input where a trained value multiplies or divides it (then not in place)."""

    kind = "constop"
    inplace = True
    OPS = ("add", "sub", "rsub", "mul", "div")

    def __init__(self, op: str, value: Any, trainable: bool = False):
        super().__init__()
        if op not in self.OPS:
            raise ValueError(f"ConstantOp: op={op!r} is not one of {', '.join(self.OPS)}")
        self.op = op
        self.value = np.asarray(value, dtype=np.float64)
        self.trainable = bool(trainable)
        if self.trainable and op in ("mul", "div"):  # the value's gradient reads the input
            self.needs = frozenset({"x"})  # type: ignore[misc]
            self.inplace = False  # type: ignore[misc]
        if op == "div" and not np.all(self.value):
            raise ValueError("ConstantOp: op='div' by a value that holds zeros")

    def extra_repr(self) -> str:
        return f"{self.op!r}, shape={self.value.shape}" + (", trainable=True" if self.trainable else "")

    def output_shape(self, in_shapes: Sequence[Shape]) -> Shape:
        self.check_arity(in_shapes)
        return _broadcasts_in(self.label, "a constant", self.value.shape, tuple(in_shapes[0]))

    def _stored(self, rank: int) -> Array:
        return stored_constant(self.value, rank)

    def param_specs(self, in_shapes: Sequence[Shape]) -> dict[str, ParamSpec]:
        stored = self._stored(len(in_shapes[0]))
        return {"value": ParamSpec(stored.shape, "value", trainable=self.trainable, value=stored)}

    def flops(self, in_shapes: Sequence[Shape]) -> int:
        return _size(in_shapes[0])

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        xp, x, v = ctx.xp, xs[0], ctx.params["value"]
        if self.op == "rsub":
            xp.subtract(v, x, out=y)
        else:
            {"add": xp.add, "sub": xp.subtract, "mul": xp.multiply, "div": xp.divide}[self.op](x, v, out=y)

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        dx, xp, v = dxs[0], ctx.xp, ctx.params["value"]
        if self.trainable:  # before dx, which may be written over dy
            grad = ctx.grads["value"]
            if self.op in ("add", "rsub"):
                local = dy
            elif self.op == "sub":
                local = xp.negative(dy)
            elif self.op == "mul":
                local = xp.multiply(dy, xs[0])  # type: ignore[index]
            else:  # d(x / v)/dv = -x / v^2
                local = xp.negative(xp.multiply(dy, xs[0]))  # type: ignore[index]
                local /= v
                local /= v
            axes = tuple(i for i, (a, b) in enumerate(zip(dy.shape, grad.shape)) if b == 1 and a != 1)
            grad[...] = xp.sum(local, axis=axes, keepdims=True) if axes else local
        if dx is None:
            return
        if self.op in ("add", "sub"):
            if dx is not dy:
                dx[...] = dy
        elif self.op == "rsub":
            xp.negative(dy, out=dx)
        elif self.op == "mul":
            xp.multiply(dy, v, out=dx)
        else:
            xp.divide(dy, v, out=dx)


class Power(Layer):
    """``Power(exponent)``: y = x ** exponent, element-wise, for a constant exponent (GPT-2's tanh GELU writes
    ``x ** 3``, a hand-written RMS norm ``x ** 2``): one number, or an array that broadcasts into the input
    without its batch axis, NumPy's way, in its logical layout (held as a buffer, stored as the input is).
    Backward needs the input: dx = dy * exponent * x ** (exponent - 1)."""

    kind = "power"
    needs = frozenset({"x"})

    def __init__(self, exponent: Any):
        super().__init__()
        self.exponent = np.asarray(exponent, dtype=np.float64)
        if not np.all(np.isfinite(self.exponent)):
            raise ValueError(f"Power: exponent {self.exponent.tolist()!r} is not finite")

    def extra_repr(self) -> str:
        e = self.exponent
        return f"{e.item():g}" if e.size == 1 else f"shape={e.shape}"

    def output_shape(self, in_shapes: Sequence[Shape]) -> Shape:
        self.check_arity(in_shapes)
        return _broadcasts_in(self.label, "an exponent", self.exponent.shape, tuple(in_shapes[0]))

    def param_specs(self, in_shapes: Sequence[Shape]) -> dict[str, ParamSpec]:
        stored = stored_constant(self.exponent, len(in_shapes[0]))
        return {"exponent": ParamSpec(stored.shape, "value", trainable=False, value=stored)}

    def flops(self, in_shapes: Sequence[Shape]) -> int:
        return 4 * _size(in_shapes[0])

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        e = ctx.params["exponent"]
        ctx.xp.power(xs[0], e.astype(y.dtype, copy=False), out=y)

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        dx = dxs[0]
        if dx is not None:
            xp, x = ctx.xp, xs[0]  # type: ignore[index]
            e = ctx.params["exponent"].astype(dx.dtype, copy=False)
            xp.power(x, e - 1, out=dx)  # x ** (e - 1) (1 where e is 1, x included)
            dx *= e
            dx *= dy


def _broadcasts_in(label: str, what: str, v: Shape, shape: Shape) -> Shape:
    """``shape``, where a constant of shape ``v`` broadcasts into it without its batch axis (NumPy's way);
    else ShapeError naming the layer."""
    if (
        len(v) > len(shape)
        or any(b not in (1, a) for a, b in zip(shape[len(shape) - len(v) :], v))
        or (len(v) == len(shape) and v and v[0] != 1)
    ):
        raise ShapeError(f"layer {label}: {what} of shape {v} does not broadcast into {shape} (without a batch axis)")
    return shape


def stored_constant(value: Any, rank: int) -> Any:
    """A constant (logical layout) that broadcasts into a tensor of ``rank``, as that tensor is stored: given
    the leading axes of length 1 it lacks, channels last where the tensor is a 4-D map."""
    v = value.reshape((1,) * (rank - value.ndim) + value.shape)
    return v.transpose(0, 2, 3, 1) if rank == 4 else v
