"""The host's convolution catalog: which of its algorithms (im2col, implicit GEMM, Winograd F(2x2, 3x3)) apply to
a convolution, and the workspace each needs per pass, laid out as :mod:`.backend`'s passes carve it."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, cast

import numpy as np


from ...nn import lanes as _lanes
from ...nn.base import PASSES, Shape
from ...nn.conv import Conv2d
from . import winograd as _winograd

if TYPE_CHECKING:
    from ...graph.program import Program

__all__ = ["ALGORITHMS", "algorithms", "workspace_bytes", "with_host_catalog"]

#: Algorithms of the host catalog, fastest first (a convolution is offered those that apply to it).
ALGORITHMS = ("winograd", "im2col", "implicit")
_ALIGN = 64
_IMPLICIT_ROWS = 4096  # output rows per GEMM step of the implicit algorithm
_COL_VALUES = 1 << 20  # values per im2col chunk (4 MiB in float32): stays in cache for its GEMM
_COL_MIN_ROWS = 2048  # ... but no fewer rows than this, so that each GEMM stays efficient


def with_host_catalog(program: Program) -> Program:
    """A copy of ``program`` whose convolutions offer the host's algorithms and their exact workspace."""
    ops = []
    for op in program.ops:
        if op.kind == "conv":
            in_shape = op.in_shapes[0]
            layer = cast(Conv2d, op.layer)
            algos = algorithms(layer, in_shape)
            ws: dict[str, dict[str | None, int]] = {
                p: {a: workspace_bytes(layer, in_shape, p, a, op.itemsize) for a in algos[p]} for p in algos
            }
            op = dataclasses.replace(op, algorithms=algos, workspace=ws)
        ops.append(op)
    return dataclasses.replace(program, ops=ops)


# -- the catalog --------------------------------------------------------------------------------------
def _is_gemm(layer: Conv2d) -> bool:
    return layer.kernel_size == (1, 1) and layer.stride == (1, 1) and layer.padding == (0, 0)


def _winograd_applies(layer: Conv2d) -> bool:
    return _winograd.applies(layer.kernel_size, layer.stride, layer.padding)


def _grouped(layer: Conv2d) -> bool:
    return getattr(layer, "groups", 1) > 1


def _implicit_only(layer: Conv2d) -> bool:
    """Grouped and dilated convolutions run the implicit algorithm only (its filter offsets take any
    spacing and any grouping; im2col and Winograd are written for dense, ungrouped filters)."""
    return _grouped(layer) or tuple(getattr(layer, "dilation", (1, 1))) != (1, 1)


def algorithms(layer: Conv2d, in_shape: Shape) -> dict[str, list[str]]:
    """The host algorithms a convolution (a :class:`~vmem.nn.Conv2d`) is offered, per pass (a grouped one:
    the implicit algorithm, each filter offset one batched product over the groups; a dilated one: the
    implicit algorithm)."""
    if _implicit_only(layer):
        return {p: ["implicit"] for p in PASSES}
    offered = [
        a
        for a in ALGORITHMS
        if a != "winograd" or (_winograd_applies(layer) and _winograd.worthwhile(layer.in_channels, layer.out_channels))
    ]
    return {p: list(offered) for p in PASSES}


def workspace_bytes(layer: Conv2d, in_shape: Shape, pass_: str, algo: str | None, itemsize: int) -> int:
    """Scratch bytes a pass of ``layer`` on a logical (NCHW) input of ``in_shape`` needs with ``algo``."""
    return _ws_bytes(itemsize, *_workspace_shapes(layer, in_shape, pass_, algo))


def _geometry(layer: Conv2d, in_shape: Shape) -> tuple[int, ...]:
    n, c, h, w = in_shape
    _, k, ho, wo = layer.output_shape([in_shape])
    return n, c, h, w, k, ho, wo


def _workspace_shapes(layer: Conv2d, in_shape: Shape, pass_: str, algo: str | None) -> list[Shape]:
    if _is_gemm(layer) and not _grouped(layer):
        return []
    n, c, h, w, k, ho, wo = _geometry(layer, in_shape)
    if _implicit_only(layer) and algo != "implicit":
        raise ValueError(
            f"layer {layer.label}: a grouped or dilated convolution runs the implicit algorithm, not {algo!r}"
        )
    if _grouped(layer):
        rows = _chunk(n, ho, wo) * ho * wo
        if pass_ == "forward":
            return [(rows, c), (rows, k)]
        if pass_ == "backward_data":
            return [(rows, k), (rows, c)]
        return [(rows, c), (rows, k), (k, c // layer.groups)]
    if algo == "winograd":
        return _flat(*_winograd_layout(layer, in_shape, pass_)[1:])
    if algo in (None, "im2col"):
        return _flat(*_im2col_layout(layer, in_shape, pass_)[1:])
    if algo == "implicit":
        rows = _chunk(n, ho, wo) * ho * wo
        if pass_ == "forward":
            return [(rows, c), (rows, k)]
        if pass_ == "backward_data":
            return [(rows, k), (rows, c)]
        return [(rows, c), (rows, k), (k, c)]
    raise ValueError(f"layer {layer.label}: unknown convolution algorithm {algo!r}; use one of {ALGORITHMS}")


def _im2col_layout(layer: Conv2d, in_shape: Shape, pass_: str) -> tuple[int, dict[str, Shape], list[dict[str, Shape]]]:
    """An im2col pass's chunking and workspace: (images per chunk, shared slots, each lane's slots).

    Each lane has a padded copy of its chunk's images (``pad``, where the convolution pads) and the
    chunk's columns (``col``); backward-filter adds the lane's own partial gradient (``acc``, except
    lane 0, which sums into dW itself) and a product to add in (``tmp``, where the lane has several
    chunks); backward-data by transposed convolution shares the flipped filters (``wflip``)."""
    n, c, h, w, k, ho, wo = _geometry(layer, in_shape)
    (kh, kw), (ph, pw) = layer.kernel_size, layer.padding
    shared: dict[str, Shape] = {}
    if pass_ == "backward_data" and _transposed_ok(layer):
        # dx = im2col(dy padded by k-1-p) @ flipped filters
        qh, qw = kh - 1 - ph, kw - 1 - pw
        nb = _col_images(n, h, w, kh * kw * k)
        shared["wflip"] = (kh * kw * k, c)
        pad = (nb, ho + 2 * qh, wo + 2 * qw, k) if qh or qw else None
        col = (nb * h * w, kh * kw * k)
    else:
        nb = _col_images(n, ho, wo, kh * kw * c)
        pad = (nb, h + 2 * ph, w + 2 * pw, c) if ph or pw else None
        col = (nb * ho * wo, kh * kw * c)
    ways = _lanes.lanes_for(n * ho * wo * kh * kw * c * k)  # the pass's multiply-adds
    nb = min(nb, -(-n // ways))  # at least one chunk for each lane
    chunks = -(-n // nb)
    lanes: list[dict[str, Shape]] = []
    for lane in range(min(ways, chunks)):
        slots: dict[str, Shape] = {"pad": pad} if pad is not None else {}
        slots["col"] = col
        if pass_ == "backward_filter":
            if lane:
                slots["acc"] = (k, kh * kw * c)
            if len(range(lane, chunks, ways)) > 1:
                slots["tmp"] = (k, kh * kw * c)
        lanes.append(slots)
    return nb, shared, lanes


def _winograd_layout(
    layer: Conv2d, in_shape: Shape, pass_: str
) -> tuple[int, dict[str, Shape], list[dict[str, Shape]]]:
    """A Winograd pass's chunking and workspace slots (see :func:`vmem.device.hostconv.winograd.layout`)."""
    if not _winograd_applies(layer):
        raise ValueError(
            f"layer {layer.label}: the winograd algorithm needs a 3x3 kernel, stride 1 and "
            f"padding at most 2, not kernel={layer.kernel_size} stride={layer.stride} "
            f"padding={layer.padding}"
        )
    n, c, h, w, k, ho, wo = _geometry(layer, in_shape)
    ways = _lanes.lanes_for(n * ho * wo * 9 * c * k)
    nb, shared, lanes = _winograd.layout(n, c, h, w, k, ho, wo, pass_, ways)
    return (
        nb,
        {name: (v,) for name, v in shared.items()},
        [{name: (v,) for name, v in slots.items()} for slots in lanes],
    )


# -- the passes ---------------------------------------------------------------------------------------


def _transposed_ok(layer: Conv2d) -> bool:
    """Backward-data as a forward convolution of dy with flipped filters: stride 1, padding < kernel."""
    (kh, kw), (ph, pw) = layer.kernel_size, layer.padding
    return layer.stride == (1, 1) and ph < kh and pw < kw


# implicit -------------------------------------------------------------------------------------------
def _chunk(n: int, ho: int, wo: int) -> int:
    """Images per step of the implicit algorithm: enough output rows (>= 4096) to keep a GEMM efficient,
    no more, so that its workspace stays small whatever the batch."""
    return min(n, -(-_IMPLICIT_ROWS // (ho * wo)))


def _ws_bytes(itemsize: int, *shapes: Shape) -> int:
    return sum(-(-int(np.prod(s)) * itemsize // _ALIGN) * _ALIGN for s in shapes)


def _flat(shared: dict[str, Shape], lanes: list[dict[str, Shape]]) -> list[Shape]:
    """A layout's slot shapes (im2col's or Winograd's) in workspace order: the shared slots, then each lane's."""
    return list(shared.values()) + [shape for slots in lanes for shape in slots.values()]


def _col_images(n: int, ho: int, wo: int, width: int) -> int:
    """Images per chunk of an im2col column matrix ``width`` values wide (about _COL_VALUES values)."""
    rows = max(_COL_MIN_ROWS, _COL_VALUES // width)
    return min(n, max(1, -(-rows // (ho * wo))))
