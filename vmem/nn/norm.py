"""Normalization over the channels of (N, C, H, W) tensors: batch norm, and local response norm (AlexNet)."""

from __future__ import annotations

from typing import Sequence, TYPE_CHECKING

from .base import AuxSpec, Ctx, Layer, ParamSpec, Shape

if TYPE_CHECKING:
    from .._typing import Array, Xp

__all__ = ["BatchNorm2d", "LocalResponseNorm"]


class BatchNorm2d(Layer):
    """``BatchNorm2d(num_features, eps=1e-5, momentum=0.1)``.

    Training normalizes with the batch's mean and biased variance and updates the running statistics
    (running variance with the unbiased estimate, as Torch does); evaluation uses the running
    statistics. Backward needs the input and the saved batch mean and 1/std (``aux``; a third per-channel
    aux, ``scale``, holds the products of per-channel values both passes make, and FP32 maps' deviations are
    made in the output or the input's gradient: a step asks the array module for no memory). Where the batch is
    split over several processes and ``ctx.batch_sum`` is given (synchronized batch norm), the statistics
    and backward's sums are the whole batch's: each process's sums added over all.
    Parameters ``weight`` (gamma) and ``bias`` (beta); buffers ``running_mean`` and ``running_var``.
    """

    kind = "batchnorm"
    needs = frozenset({"x"})

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1):
        super().__init__()
        if not isinstance(num_features, int) or num_features <= 0:
            raise ValueError(f"BatchNorm2d: num_features={num_features!r} must be a positive int")
        self.num_features = num_features
        self.eps = float(eps)
        self.momentum = float(momentum)

    def extra_repr(self) -> str:
        return f"{self.num_features}"

    def output_shape(self, in_shapes: Sequence[Shape]) -> Shape:
        from ..errors import ShapeError

        self.check_arity(in_shapes)
        shape = in_shapes[0]
        self.expect_rank(shape, 4)
        if shape[1] != self.num_features:
            raise ShapeError(
                f"layer {self.label}: expects input of shape (N, {self.num_features}, H, W), got {tuple(shape)}"
            )
        return tuple(shape)

    def param_specs(self, in_shapes: Sequence[Shape]) -> dict[str, ParamSpec]:
        c = (self.num_features,)
        return {
            "weight": ParamSpec(c, "ones"),
            "bias": ParamSpec(c, "zeros"),
            "running_mean": ParamSpec(c, "zeros", trainable=False),
            "running_var": ParamSpec(c, "ones", trainable=False),
        }

    def aux_specs(self, in_shapes: Sequence[Shape]) -> dict[str, AuxSpec]:
        c = (self.num_features,)
        # scale: room for the per-channel products (gamma / std, the running statistics' updates), so that
        # a step asks the array module for no memory (a captured step replays without it)
        return {"mean": AuxSpec(c, "float"), "invstd": AuxSpec(c, "float"), "scale": AuxSpec(c, "float")}

    def flops(self, in_shapes: Sequence[Shape]) -> int:
        n, c, h, w = in_shapes[0]
        return 4 * n * c * h * w

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        xp, p, aux = ctx.xp, ctx.params, ctx.aux
        c = self.num_features
        x2 = xs[0].reshape(-1, c)
        y2 = y.reshape(-1, c)
        mean, invstd, scale = aux["mean"], aux["invstd"], aux["scale"]
        if ctx.train and not ctx.replay:
            m = x2.shape[0]
            ctx.ops.column_sum(x2, out=mean)  # the mean and the variance, as NumPy computes them
            if ctx.batch_sum is not None:  # the whole batch's sums and count, over every process
                both = xp.concatenate([mean, xp.asarray([m], dtype=mean.dtype)])
                ctx.batch_sum(both)
                mean[...], m = both[:c], int(round(float(both[c])))
            mean /= m
            var = invstd  # the variance, then 1/std in its place
            if xp.result_type(x2, mean) == y2.dtype:  # the squared deviations made in the output
                xp.subtract(x2, mean, out=y2)
                y2 *= y2
                ctx.ops.column_sum(y2, out=var)
            else:  # half maps: the deviations in FP32
                centred = x2 - mean
                centred *= centred
                ctx.ops.column_sum(centred, out=var)
            if ctx.batch_sum is not None:
                ctx.batch_sum(var)
            var /= m
            rm, rv = p["running_mean"], p["running_var"]
            rm *= 1.0 - self.momentum
            rm += xp.multiply(mean, self.momentum, out=scale)
            rv *= 1.0 - self.momentum
            rv += xp.multiply(var, self.momentum * m / max(m - 1, 1), out=scale)
            var += self.eps
            xp.sqrt(var, out=invstd)
            xp.divide(1.0, invstd, out=invstd)
        elif not ctx.train:
            mean[...] = p["running_mean"]
            xp.add(p["running_var"], self.eps, out=invstd)
            xp.sqrt(invstd, out=invstd)
            xp.divide(1.0, invstd, out=invstd)
        # a replay (ctx.replay) writes the same output from the statistics it saved: nothing is summed again
        xp.subtract(x2, mean, out=y2)
        y2 *= xp.multiply(invstd, p["weight"], out=scale)
        y2 += p["bias"]

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        xp, aux = ctx.xp, ctx.aux
        c = self.num_features
        x2 = xs[0].reshape(-1, c)  # type: ignore[index]
        dy2 = dy.reshape(-1, c)
        mean, invstd, scale = aux["mean"], aux["invstd"], aux["scale"]
        dgamma, dbeta = ctx.grads["weight"], ctx.grads["bias"]
        dx = dxs[0]
        dx2 = None if dx is None else dx.reshape(-1, c)
        if dx2 is not None and xp.result_type(x2, mean) == dx2.dtype:  # x-hat made in dx, twice
            xp.subtract(x2, mean, out=dx2)
            dx2 *= invstd
            dx2 *= dy2
            ctx.ops.column_sum(dx2, out=dgamma)
            xp.subtract(x2, mean, out=dx2)
            dx2 *= invstd
            xhat = dx2
        else:  # half maps, or no dx to make it in: x-hat in FP32 of its own
            xhat = (x2 - mean) * invstd
            ctx.ops.column_sum(dy2 * xhat, out=dgamma)
        ctx.ops.column_sum(dy2, out=dbeta)
        if dx2 is None:
            return
        if ctx.train:
            m = x2.shape[0]
            sums_g, sums_b = dgamma, dbeta
            if ctx.batch_sum is not None:  # dx needs the whole batch's sums (the parameters' gradients stay
                # this process's: they are averaged over the processes with the others)
                both = xp.concatenate([dgamma, dbeta, xp.asarray([m], dtype=dgamma.dtype)])
                ctx.batch_sum(both)
                sums_g, sums_b, m = both[:c], both[c : 2 * c], int(round(float(both[2 * c])))
            xhat *= xp.divide(sums_g, m, out=scale)
            xp.subtract(dy2, xhat, out=dx2)
            dx2 -= xp.divide(sums_b, m, out=scale)
            dx2 *= xp.multiply(ctx.params["weight"], invstd, out=scale)
        else:
            xp.multiply(dy2, xp.multiply(ctx.params["weight"], invstd, out=scale), out=dx2)


class LocalResponseNorm(Layer):
    """``LocalResponseNorm(size, alpha=1e-4, beta=0.75, k=1.0)`` (AlexNet's, ONNX's LRN, PyTorch's
    ``nn.LocalResponseNorm`` for odd sizes): over (N, C, H, W), ``y = x / (k + alpha / size * S) ** beta``, ``S`` the sum of
    the squares of ``x`` over the ``size`` channels around each one (``(size - 1) // 2`` before, the rest
    after; fewer at the edges). Each sample on its own. Backward needs the input (the sums are made again)::

        dx = dy * s**-beta - 2 * alpha * beta / size * x * T(dy * x * s**(-beta - 1))

    ``s`` the denominator's base and ``T`` the same window sum with its sides swapped (the transpose)."""

    kind = "lrn"
    needs = frozenset({"x"})

    def __init__(self, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0):
        super().__init__()
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise ValueError(f"LocalResponseNorm: size={size!r} must be a positive int")
        self.size, self.alpha, self.beta, self.k = size, float(alpha), float(beta), float(k)

    def extra_repr(self) -> str:
        return f"{self.size}, alpha={self.alpha:g}, beta={self.beta:g}, k={self.k:g}"

    def output_shape(self, in_shapes: Sequence[Shape]) -> Shape:
        self.check_arity(in_shapes)
        self.expect_rank(in_shapes[0], 4)
        return tuple(in_shapes[0])

    def flops(self, in_shapes: Sequence[Shape]) -> int:
        n = 1
        for d in in_shapes[0]:
            n *= d
        return (self.size + 6) * n

    def _window(self, xp: Xp, a: Array, before: int, after: int) -> Array:
        """Per channel (the last axis, channels-last), the sum of ``a`` over ``before`` channels before it,
        itself and ``after`` after it (zeros past the edges)."""
        c = a.shape[-1]
        pad = [(0, 0)] * (a.ndim - 1) + [(before + 1, after)]
        cum = xp.cumsum(xp.pad(a, pad), axis=-1)
        return cum[..., before + 1 + after :][..., :c] - cum[..., :c]

    def _base(self, xp: Xp, x: Array) -> Array:
        before = (self.size - 1) // 2
        return self.k + (self.alpha / self.size) * self._window(xp, x * x, before, self.size - 1 - before)

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        xp, x = ctx.xp, xs[0]
        y[...] = x * self._base(xp, x) ** -self.beta

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        dx = dxs[0]
        if dx is None:
            return
        assert xs is not None  # needs = {"x"}
        xp, x = ctx.xp, xs[0]
        s = self._base(xp, x)
        before = (self.size - 1) // 2
        inner = self._window(xp, dy * x * s ** (-self.beta - 1), self.size - 1 - before, before)
        dx[...] = dy * s**-self.beta - (2 * self.alpha * self.beta / self.size) * x * inner
