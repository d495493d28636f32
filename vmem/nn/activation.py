"""Element-wise layers: ReLU, Clip (ReLU6), Sigmoid, Tanh and HardSigmoid (in place where the graph allows),
HardSwish and SiLU (MobileNetV3's and EfficientNet's), Erf, GELU and Dropout. Arithmetic of two tensors or
with a constant is in :mod:`.arith`."""

from __future__ import annotations

import math
from typing import Sequence, TYPE_CHECKING


from .base import AuxSpec, Ctx, Layer, Shape

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
