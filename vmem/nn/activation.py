"""Element-wise layers: ReLU, Clip (ReLU6), Sigmoid, Tanh and HardSigmoid (in place where the graph allows),
HardSwish and SiLU (MobileNetV3's and EfficientNet's), Dropout, the product of two tensors (Mul), and
arithmetic with a constant (ConstantOp)."""

from __future__ import annotations

import math
from typing import Any, Sequence, TYPE_CHECKING

import numpy as np

from ..errors import ShapeError
from .base import AuxSpec, Ctx, Layer, ParamSpec, Shape

if TYPE_CHECKING:
    from .._typing import Array
    from .._typing import Xp

__all__ = [
    "ReLU",
    "Clip",
    "Sigmoid",
    "Tanh",
    "HardSigmoid",
    "HardSwish",
    "SiLU",
    "Erf",
    "Mul",
    "Sub",
    "Div",
    "ConstantOp",
    "Dropout",
]


class ReLU(Layer):
    """y = max(x, 0), computed in place where the graph allows. Backward needs only the sign of y."""

    kind = "relu"
    needs = frozenset({"mask"})
    inplace = True

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        ctx.ops.relu(xs[0], y)  # in place where y is x: the device's ops never copy an overlapping input

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        if dxs[0] is not None:
            ctx.ops.relu_backward(y, dy, dxs[0])


class Clip(Layer):
    """``Clip(lo, hi)``: y = min(max(x, lo), hi) (``Clip(0, 6)`` is ReLU6), in place where the graph allows.
    Backward needs its output: the gradient passes where lo < y < hi, which is where lo < x < hi (as
    PyTorch's hardtanh passes it), and is 0 where the value was clipped."""

    kind = "clip"
    needs = frozenset({"y"})
    inplace = True

    def __init__(self, lo: float = 0.0, hi: float = 6.0):
        super().__init__()
        lo, hi = float(lo), float(hi)
        if not lo <= hi:
            raise ValueError(f"Clip: lo={lo!r} must be at most hi={hi!r}")
        self.lo, self.hi = lo, hi

    def extra_repr(self) -> str:
        return f"{self.lo:g}, {self.hi:g}"

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        x, xp = xs[0], ctx.xp
        ctx.ops.rows(y.shape[0], lambda r: xp.clip(x[r], self.lo, self.hi, out=y[r]), y.size)

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        if dxs[0] is not None:
            assert y is not None  # Clip's backward reads its output (needs = {"y"})
            xp, dx = ctx.xp, dxs[0]
            lo, hi = self.lo, self.hi
            ctx.ops.rows(dy.shape[0], lambda r: xp.multiply(dy[r], (y[r] > lo) & (y[r] < hi), out=dx[r]), dy.size)


class Sigmoid(Layer):
    """y = 1 / (1 + exp(-x)), in place where the graph allows. Backward needs y: dx = dy * y * (1 - y)."""

    kind = "sigmoid"
    needs = frozenset({"y"})
    inplace = True

    def flops(self, in_shapes: Sequence[Shape]) -> int:
        return 4 * _size(in_shapes[0])

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        xp = ctx.xp
        xp.negative(xs[0], out=y)
        xp.exp(y, out=y)
        y += 1
        xp.reciprocal(y, out=y)

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        dx = dxs[0]
        if dx is not None:  # dx may share dy's memory (in place): read dy before writing dx
            assert y is not None  # needs = {"y"}
            ctx.xp.multiply(dy, y * (1 - y), out=dx)


class Tanh(Layer):
    """y = tanh(x), in place where the graph allows. Backward needs y: dx = dy * (1 - y^2)."""

    kind = "tanh"
    needs = frozenset({"y"})
    inplace = True

    def flops(self, in_shapes: Sequence[Shape]) -> int:
        return 4 * _size(in_shapes[0])

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        ctx.xp.tanh(xs[0], out=y)

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        dx = dxs[0]
        if dx is not None:
            assert y is not None  # needs = {"y"}
            ctx.xp.multiply(dy, 1 - y * y, out=dx)


class HardSigmoid(Layer):
    """``HardSigmoid(alpha=1/6, beta=0.5)``: y = min(max(alpha x + beta, 0), 1) (PyTorch's ``nn.Hardsigmoid``
    with the defaults; ONNX's HardSigmoid takes both), in place where the graph allows. Backward needs its
    output: dx = alpha dy where 0 < y < 1 (as PyTorch's, which passes it where -3 < x < 3), else 0."""

    kind = "hardsigmoid"
    needs = frozenset({"y"})
    inplace = True

    def __init__(self, alpha: float = 1.0 / 6.0, beta: float = 0.5):
        super().__init__()
        self.alpha, self.beta = float(alpha), float(beta)
        if not self.alpha > 0:
            raise ValueError(f"HardSigmoid: alpha={alpha!r} must be positive")

    def extra_repr(self) -> str:
        return f"alpha={self.alpha:g}, beta={self.beta:g}"

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        x, xp = xs[0], ctx.xp
        alpha, beta = y.dtype.type(self.alpha), y.dtype.type(self.beta)

        def rows(r: slice) -> None:
            xp.multiply(x[r], alpha, out=y[r])
            y[r] += beta
            xp.clip(y[r], 0, 1, out=y[r])

        ctx.ops.rows(y.shape[0], rows, y.size)

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        dx = dxs[0]
        if dx is not None:
            assert y is not None  # needs = {"y"}
            xp, alpha = ctx.xp, dy.dtype.type(self.alpha)

            def rows(r: slice) -> None:
                xp.multiply(dy[r], (y[r] > 0) & (y[r] < 1), out=dx[r])
                dx[r] *= alpha

            ctx.ops.rows(dy.shape[0], rows, dy.size)


class HardSwish(Layer):
    """y = x min(max(x + 3, 0), 6) / 6 (PyTorch's ``nn.Hardswish``, ONNX's HardSwish: MobileNetV3's
    activation). Backward needs the input: dx = dy (x / 3 + 1/2) for -3 <= x <= 3, dy above, 0 below (as
    PyTorch's)."""

    kind = "hardswish"
    needs = frozenset({"x"})

    def flops(self, in_shapes: Sequence[Shape]) -> int:
        return 4 * _size(in_shapes[0])

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        x, xp = xs[0], ctx.xp
        three, six = y.dtype.type(3), y.dtype.type(6)

        def rows(r: slice) -> None:
            xp.add(x[r], three, out=y[r])
            xp.clip(y[r], 0, six, out=y[r])
            y[r] *= x[r]
            y[r] /= six

        ctx.ops.rows(y.shape[0], rows, y.size)

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        dx = dxs[0]
        if dx is not None:
            x, xp = xs[0], ctx.xp  # type: ignore[index]
            t = dy.dtype.type

            def rows(r: slice) -> None:
                xr = x[r]
                slope = xp.where(xr < t(-3), t(0), xp.where(xr <= t(3), xr / t(3) + t(0.5), t(1)))
                xp.multiply(dy[r], slope, out=dx[r])

            ctx.ops.rows(dy.shape[0], rows, dy.size)


class SiLU(Layer):
    """y = x sigmoid(x) (PyTorch's ``nn.SiLU``, swish: EfficientNet's activation; exporters write it as a
    Sigmoid and a Mul, which the importer reads as these two layers). Backward needs the input:
    dx = dy s (1 + x (1 - s)), s = sigmoid(x)."""

    kind = "silu"
    needs = frozenset({"x"})

    def flops(self, in_shapes: Sequence[Shape]) -> int:
        return 5 * _size(in_shapes[0])

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        x, xp = xs[0], ctx.xp

        def rows(r: slice) -> None:
            xp.negative(x[r], out=y[r])
            xp.exp(y[r], out=y[r])
            y[r] += 1
            xp.divide(x[r], y[r], out=y[r])

        ctx.ops.rows(y.shape[0], rows, y.size)

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        dx = dxs[0]
        if dx is not None:
            x, xp = xs[0], ctx.xp  # type: ignore[index]

            def rows(r: slice) -> None:
                s = 1 / (1 + xp.exp(-x[r]))
                xp.multiply(dy[r], s * (1 + x[r] * (1 - s)), out=dx[r])

            ctx.ops.rows(dy.shape[0], rows, dy.size)


class Erf(Layer):
    """y = erf(x) (GELU's exact form, 0.5 x (1 + erf(x / sqrt 2)), as exporters write it). Backward needs the
    input: dx = dy * 2 / sqrt(pi) * exp(-x^2)."""

    kind = "erf"
    needs = frozenset({"x"})

    def flops(self, in_shapes: Sequence[Shape]) -> int:
        return 10 * _size(in_shapes[0])

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        ctx.ops.erf(xs[0], out=y)

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        dx = dxs[0]
        if dx is not None:
            xp, x = ctx.xp, xs[0]  # type: ignore[index]
            xp.multiply(x, x, out=dx)
            xp.negative(dx, out=dx)
            xp.exp(dx, out=dx)
            dx *= dx.dtype.type(2.0 / math.sqrt(math.pi))
            dx *= dy


class GELU(Layer):
    """``GELU(approximate="none")``: y = x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), the Gaussian error linear unit
    (BERT's feed-forward), or with ``approximate="tanh"`` 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
    (GPT-2's). One layer instead of the ops exporters write (its input the only buffer backward reads, where
    the ops would stash three). Backward needs the input."""

    kind = "gelu"
    needs = frozenset({"x"})
    APPROXIMATIONS = ("none", "tanh")
    _C = math.sqrt(2 / math.pi)

    def __init__(self, approximate: str = "none"):
        super().__init__()
        if approximate not in self.APPROXIMATIONS:
            raise ValueError(f"GELU: approximate={approximate!r} is not one of {', '.join(self.APPROXIMATIONS)}")
        self.approximate = approximate

    def extra_repr(self) -> str:
        return "" if self.approximate == "none" else f"approximate={self.approximate!r}"

    def flops(self, in_shapes: Sequence[Shape]) -> int:
        return 14 * _size(in_shapes[0])

    def _inner(self, xp: Xp, x: Array, out: Array) -> None:
        """out = sqrt(2 / pi) (x + 0.044715 x^3), the tanh form's argument."""
        one = out.dtype.type
        xp.multiply(x, x, out=out)
        out *= one(0.044715)
        out += one(1)
        out *= x
        out *= one(self._C)

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        xp, x = ctx.xp, xs[0]
        one = y.dtype.type
        if self.approximate == "tanh":
            self._inner(xp, x, y)
            xp.tanh(y, out=y)
        else:
            xp.multiply(x, one(1 / math.sqrt(2)), out=y)
            ctx.ops.erf(y, out=y)
        y += one(1)
        y *= x
        y *= one(0.5)

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        dx = dxs[0]
        if dx is None:
            return
        xp, x = ctx.xp, xs[0]  # type: ignore[index]
        one = dx.dtype.type
        if self.approximate == "tanh":  # t = tanh(u): dy/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) u'(x)
            self._inner(xp, x, dx)
            xp.tanh(dx, out=dx)  # t
            slope = xp.multiply(x, x)
            slope *= one(3 * 0.044715)
            slope += one(1)
            slope *= one(self._C)  # u'(x)
            slope *= x
            slope *= one(0.5)
            square = xp.multiply(dx, dx)
            xp.subtract(one(1), square, out=square)
            slope *= square  # 0.5 x (1 - t^2) u'(x)
            dx += one(1)
            dx *= one(0.5)
            dx += slope
            dx *= dy
            return
        xp.multiply(x, one(1 / math.sqrt(2)), out=dx)
        ctx.ops.erf(dx, out=dx)
        dx += one(1)
        dx *= one(0.5)  # Phi(x)
        density = xp.multiply(x, x)
        density *= one(-0.5)
        xp.exp(density, out=density)
        density *= x
        density *= one(1 / math.sqrt(2 * math.pi))  # x phi(x)
        dx += density
        dx *= dy


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
        shape, v = tuple(in_shapes[0]), self.value.shape
        if (
            len(v) > len(shape)
            or any(b not in (1, a) for a, b in zip(shape[len(shape) - len(v) :], v))
            or (len(v) == len(shape) and v and v[0] != 1)
        ):
            raise ShapeError(
                f"layer {self.label}: a constant of shape {v} does not broadcast into {shape} (without a batch axis)"
            )
        return shape

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


def stored_constant(value: Any, rank: int) -> Any:
    """A constant (logical layout) that broadcasts into a tensor of ``rank``, as that tensor is stored: given
    the leading axes of length 1 it lacks, channels last where the tensor is a 4-D map."""
    v = value.reshape((1,) * (rank - value.ndim) + value.shape)
    return v.transpose(0, 2, 3, 1) if rank == 4 else v


def _size(shape: Shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


class Dropout(Layer):
    """Inverted dropout: in training, zero each value with probability ``p`` and scale the rest by
    1/(1-p); in evaluation, the identity. The mask is saved for backward as bits (``numpy.packbits``
    order: 1 bit per value), so a replay (``ctx.replay``) drops the same units without drawing again."""

    kind = "dropout"
    inplace = True

    def __init__(self, p: float = 0.5):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"Dropout: p={p!r} must be in [0, 1)")
        self.p = float(p)

    def extra_repr(self) -> str:
        return f"p={self.p}"

    def aux_specs(self, in_shapes: Sequence[Shape]) -> dict[str, AuxSpec]:
        return {"mask": AuxSpec((-(-_size(in_shapes[0]) // 8),), "uint8")}

    def _keep(self, ctx: Ctx, shape: tuple) -> Array:
        """The saved mask as booleans of ``shape``."""
        n = _size(shape)
        return ctx.xp.unpackbits(ctx.aux["mask"])[:n].reshape(shape).view(bool)

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        xp, x = ctx.xp, xs[0]
        if not ctx.train or self.p == 0.0:
            if not xp.may_share_memory(x, y):
                y[...] = x
            return
        if ctx.replay:
            keep = self._keep(ctx, x.shape)
        else:  # drawn on the host from the step's generator, so every device drops the same units
            keep = xp.asarray(ctx.rng.random(x.shape, dtype=x.dtype) >= self.p)
            ctx.aux["mask"][...] = xp.packbits(keep.ravel())
        xp.multiply(x, keep, out=y)
        y *= 1.0 / (1.0 - self.p)

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        dx = dxs[0]
        if dx is None:
            return
        if not ctx.train or self.p == 0.0:
            if not ctx.xp.may_share_memory(dx, dy):
                dx[...] = dy
            return
        ctx.xp.multiply(dy, self._keep(ctx, dy.shape), out=dx)
        dx *= 1.0 / (1.0 - self.p)
