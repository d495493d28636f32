"""Batch normalization over the channels of (N, C, H, W) tensors."""

from __future__ import annotations

from typing import Sequence, TYPE_CHECKING

from .base import AuxSpec, Ctx, Layer, ParamSpec, Shape

if TYPE_CHECKING:
    from .._typing import Array

__all__ = ["BatchNorm2d"]


class BatchNorm2d(Layer):
    """``BatchNorm2d(num_features, eps=1e-5, momentum=0.1)``.

    Training normalizes with the batch's mean and biased variance and updates the running statistics
    (running variance with the unbiased estimate, as Torch does); evaluation uses the running
    statistics. Backward needs the input and the saved batch mean and 1/std (``aux``). Where the batch is
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
        return {"mean": AuxSpec(c, "float"), "invstd": AuxSpec(c, "float")}

    def flops(self, in_shapes: Sequence[Shape]) -> int:
        n, c, h, w = in_shapes[0]
        return 4 * n * c * h * w

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        xp, p, aux = ctx.xp, ctx.params, ctx.aux
        c = self.num_features
        x2 = xs[0].reshape(-1, c)
        mean, invstd = aux["mean"], aux["invstd"]
        if ctx.train:
            m = x2.shape[0]
            ctx.ops.column_sum(x2, out=mean)  # the mean and the variance, as NumPy computes them
            if ctx.batch_sum is not None:  # the whole batch's sums and count, over every process
                both = xp.concatenate([mean, xp.asarray([m], dtype=mean.dtype)])
                ctx.batch_sum(both)
                mean[...], m = both[:c], int(round(float(both[c])))
            mean /= m
            centred = x2 - mean
            centred *= centred
            var = ctx.ops.column_sum(centred)
            if ctx.batch_sum is not None:
                ctx.batch_sum(var)
            var /= m
        if ctx.train and not ctx.replay:  # a replay writes the same output and leaves the statistics alone
            rm, rv = p["running_mean"], p["running_var"]
            rm *= 1.0 - self.momentum
            rm += self.momentum * mean
            rv *= 1.0 - self.momentum
            rv += (self.momentum * m / max(m - 1, 1)) * var
        elif not ctx.train:
            mean[...] = p["running_mean"]
            var = p["running_var"]
        invstd[...] = 1.0 / xp.sqrt(var + self.eps)
        y2 = y.reshape(-1, c)
        xp.subtract(x2, mean, out=y2)
        y2 *= invstd * p["weight"]
        y2 += p["bias"]

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        xp, aux = ctx.xp, ctx.aux
        c = self.num_features
        x2 = xs[0].reshape(-1, c)  # type: ignore[index]
        dy2 = dy.reshape(-1, c)
        mean, invstd = aux["mean"], aux["invstd"]
        xhat = (x2 - mean) * invstd
        dgamma, dbeta = ctx.grads["weight"], ctx.grads["bias"]
        ctx.ops.column_sum(dy2 * xhat, out=dgamma)
        ctx.ops.column_sum(dy2, out=dbeta)
        dx = dxs[0]
        if dx is None:
            return
        dx2 = dx.reshape(-1, c)
        scale = ctx.params["weight"] * invstd
        if ctx.train:
            m = x2.shape[0]
            sums_g, sums_b = dgamma, dbeta
            if ctx.batch_sum is not None:  # dx needs the whole batch's sums (the parameters' gradients stay
                # this process's: they are averaged over the processes with the others)
                both = xp.concatenate([dgamma, dbeta, xp.asarray([m], dtype=dgamma.dtype)])
                ctx.batch_sum(both)
                sums_g, sums_b, m = both[:c], both[c : 2 * c], int(round(float(both[2 * c])))
            xhat *= sums_g / m
            xp.subtract(dy2, xhat, out=dx2)
            dx2 -= sums_b / m
            dx2 *= scale
        else:
            xp.multiply(dy2, scale, out=dx2)
