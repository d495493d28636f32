"""Element-wise layers: ReLU (in place) and Dropout."""

from __future__ import annotations

from typing import Any, Sequence

from .base import AuxSpec, Ctx, Layer, Shape, physical

__all__ = ["ReLU", "Dropout"]


class ReLU(Layer):
    """y = max(x, 0), computed in place where the graph allows. Backward needs only the sign of y."""

    kind = "relu"
    needs = frozenset({"mask"})
    inplace = True

    def forward(self, ctx: Ctx, xs: list[Any], y: Any) -> None:
        ctx.xp.maximum(xs[0], 0, out=y)

    def backward(self, ctx: Ctx, dy: Any, xs: list[Any] | None, y: Any | None, dxs: list[Any | None]) -> None:
        if dxs[0] is not None:
            ctx.xp.multiply(dy, y > 0, out=dxs[0])


class Dropout(Layer):
    """Inverted dropout: in training, zero each value with probability ``p`` and scale the rest by
    1/(1-p); in evaluation, the identity. The mask is saved for backward (1 byte per value)."""

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
        return {"mask": AuxSpec(physical(in_shapes[0]), "uint8")}

    def forward(self, ctx: Ctx, xs: list[Any], y: Any) -> None:
        xp, x, mask = ctx.xp, xs[0], ctx.aux["mask"]
        if not ctx.train or self.p == 0.0:
            mask.fill(1)
            if not xp.may_share_memory(x, y):
                y[...] = x
            return
        # drawn on the host from the step's generator, so every device drops the same units
        xp.greater_equal(xp.asarray(ctx.rng.random(x.shape, dtype=x.dtype)), self.p, out=mask.view(bool))
        xp.multiply(x, mask, out=y)
        y *= 1.0 / (1.0 - self.p)

    def backward(self, ctx: Ctx, dy: Any, xs: list[Any] | None, y: Any | None, dxs: list[Any | None]) -> None:
        dx = dxs[0]
        if dx is None:
            return
        ctx.xp.multiply(dy, ctx.aux["mask"], out=dx)
        if ctx.train and self.p:
            dx *= 1.0 / (1.0 - self.p)
