"""Float32 compute over low-precision storage (:mod:`vmem.device.staging`), as the executor runs it: a staged
op's layer called on float32 copies carved from the end of its workspace, each output rounded once back."""

from __future__ import annotations

from typing import Any, Callable, TYPE_CHECKING

import numpy as np

from ..nn.base import Ctx

if TYPE_CHECKING:
    from .._typing import Array

__all__ = ["staged_forward", "staged_backward"]

#: one staged pass's copies: (role, input index, shape, aligned bytes), in workspace order
Items = list[tuple[str, int, tuple[int, ...], int]]


def _copies(items: Items, ctx: Ctx) -> dict[tuple[str, int], Any]:
    """The pass's float32 copies, carved from the end of its workspace (the layer keeps the start)."""
    ws = ctx.workspace
    assert ws is not None, "a staged pass's workspace holds its copies"
    total = sum(n for *_, n in items)
    base = ws.nbytes - total
    ctx.workspace = ws[:base] if base else None
    copies, at = {}, base
    for role, j, shape, n in items:
        copies[(role, j)] = ws[at : at + int(np.prod(shape)) * 4].view(np.float32).reshape(shape)
        at += n
    return copies


def staged_forward(forward: Callable[..., None], items: Items, ctx: Ctx) -> Callable[..., None]:
    """The layer's ``forward`` on float32 copies of its low-precision inputs, its output rounded once back."""
    copies = _copies(items, ctx)

    def run(ctx: Ctx, xs: list[Array], y: Array) -> None:
        xs32 = [_cast_into(copies[("x", j)], x) if ("x", j) in copies else x for j, x in enumerate(xs)]
        y32 = copies.get(("y", -1), y)
        forward(ctx, xs32, y32)
        if y32 is not y:
            with np.errstate(over="ignore"):  # past fp16's range is inf, as IEEE storage is
                y[...] = y32  # one rounding (to nearest even) per output

    return run


def staged_backward(backward: Callable[..., None], items: Items, ctx: Ctx) -> Callable[..., None]:
    """The layer's ``backward`` on float32 copies of what it reads, each input gradient rounded once back."""
    copies = _copies(items, ctx)

    def run(ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array, dxs: list[Array]) -> None:
        dy32 = _cast_into(copies[("dy", -1)], dy) if ("dy", -1) in copies else dy
        if xs is not None:
            xs = [_cast_into(copies[("x", j)], x) if ("x", j) in copies else x for j, x in enumerate(xs)]
        if y is not None and ("y", -1) in copies:
            y = _cast_into(copies[("y", -1)], y)
        dxs32 = [copies[("dx", j)] if d is not None and ("dx", j) in copies else d for j, d in enumerate(dxs)]
        backward(ctx, dy32, xs, y, dxs32)
        for d, d32 in zip(dxs, dxs32):
            if d is not None and d32 is not d:
                with np.errstate(over="ignore"):
                    d[...] = d32

    return run


def _cast_into(dst: Array, src: Array) -> Array:
    """``src`` widened into ``dst`` (exact: every fp16 and bf16 value is a float32); ``dst``."""
    dst[...] = src
    return dst
