"""The host's convolutions (NumPy, channels last): the CPU device's :class:`~vmem.device.base.ConvBackend`
(its catalog, which algorithms apply and their workspace: :mod:`.catalog`).

Three algorithms per pass, each trading workspace for speed:

* ``im2col``: gather the receptive fields of a few images into a column matrix (about 1M values, so it
  is still in cache when the GEMM reads it), then one GEMM per chunk. Its workspace is the column chunk
  plus a zero-padded copy of the chunk's images. With stride 1, backward-data is the same thing applied to
  dy with the filters flipped (a "full" convolution), which avoids scattering columns back; strided
  convolutions scatter (col2im).
* ``implicit``: for each of the kh*kw filter offsets, one GEMM over the shifted input region,
  accumulated into the output, a few images at a time (enough for 4,096 output rows). The workspace
  holds one region of those images (for 3x3 filters about 9C/(C+K) times less than im2col's columns
  for the same rows), and it is slower.
* ``winograd`` (3x3 kernels, stride 1, padding up to 2, at least 16 channels in and out): Winograd's
  F(2x2, 3x3), 2.25x fewer multiply-adds than im2col in 16 GEMMs over transformed tiles (see
  :mod:`vmem.device.hostconv.winograd`); its workspace holds a chunk's transformed tiles and the
  transformed filters.

A 1x1 convolution with stride 1 and no padding is a plain GEMM for all, with no workspace. All give the
same results up to float32 rounding. This catalog is what memory-optimal versus performance-optimal
selection acts on on the CPU; the CUDA device offers cuDNN's algorithms under the same protocol.

The big products are cut into pieces by shape (:mod:`vmem.nn.lanes`) and run by the Ctx's ``ops``: the
CPU device's run them side by side on its core budget.
"""

from __future__ import annotations

import time
from typing import Any, Iterator, TYPE_CHECKING

import numpy as np

from ...nn.base import Ctx, Shape
from ...nn.conv import Conv2d, span as _span
from . import winograd as _winograd
from .arrays import _gather, _image_chunks, _ones
from .catalog import (
    _transposed_ok,
    _chunk,
    _flat,
    with_host_catalog,
    _is_gemm,
    _grouped,
    _implicit_only,
    algorithms,
    workspace_bytes,
    _im2col_layout,
    _winograd_layout,
    ALGORITHMS,
    _ALIGN,
)

if TYPE_CHECKING:
    from ..._typing import Array
    from numpy.typing import DTypeLike
    from ...graph.program import Program

__all__ = ["ALGORITHMS", "HostConv", "algorithms", "workspace_bytes", "with_host_catalog"]


class HostConv:
    """The host's convolutions as a :class:`~vmem.device.base.ConvBackend`: :data:`ALGORITHMS`, their
    workspace carved from the pass's workspace (``ctx.workspace``), their pieces run by ``ctx.ops``."""

    #: a profile times every algorithm the catalog offers (there are at most three)
    ranked_top = len(ALGORITHMS)

    def catalog(self, program: Program) -> Program:
        """``program`` whose convolutions offer the host's algorithms (:func:`with_host_catalog`)."""
        return with_host_catalog(program)

    def forward(self, layer: Conv2d, ctx: Ctx, x: Array, w: Array, y: Array, b: Array = None) -> None:
        """``y = conv(x, w) + b`` (no bias where ``b`` is None) with ``ctx.algo``; with ``ctx.relu`` the ReLU
        over ``y`` after it (as the ReLU layer computes it)."""
        forward(layer, ctx, x, w, y, b)
        if ctx.relu:
            ctx.ops.relu(y, y)

    def backward(
        self,
        layer: Conv2d,
        ctx: Ctx,
        dy: Array,
        x: Array | None,
        w: Array,
        dx: Array | None,
        dw: Array | None,
        db: Array | None = None,
    ) -> None:
        """``db`` where given, ``dw`` unless it is None, then ``dx`` unless it is None, with ``ctx.algo`` (one name or a pair
        (backward_data, backward_filter)), one after the other in the same workspace."""
        backward(layer, ctx, dy, x, w, dx, dw, db)

    def heuristic(
        self, layer: Conv2d, pass_: str, x_shape: tuple[int, ...], y_shape: tuple[int, ...], dtype: str = "float32"
    ) -> list[str]:
        """The algorithms offered for the pass, in the catalog's order (fastest first as a rule); a profile
        times them all (:attr:`ranked_top`)."""
        n, h, w, c = x_shape
        return algorithms(layer, (n, c, h, w))[pass_]

    def find(self, layer: Conv2d, pass_: str, x: Array, w: Array, y: Array, ws: Array) -> list[tuple[str, float, int]]:
        """Each algorithm of the pass run once on these buffers (as cuDNN's search: ``x`` the input or its
        gradient, ``w`` the filters or their gradient, ``y`` the output or its gradient) and timed;
        (name, seconds, workspace bytes), fastest first. One whose workspace exceeds ``ws`` is left out."""
        from ...nn.ops import HostOps

        n, h, wd, c = x.shape
        in_shape = (n, c, h, wd)
        room = 0 if ws is None else ws.nbytes
        found = []
        for algo in algorithms(layer, in_shape)[pass_]:
            need = workspace_bytes(layer, in_shape, pass_, algo, x.dtype.itemsize)
            if need > room:
                continue
            ctx = Ctx(xp=np, algo=algo if pass_ == "forward" else (algo, algo), workspace=ws, ops=HostOps())
            start = time.perf_counter()
            if pass_ == "forward":
                forward(layer, ctx, x, w, y, None)
            elif pass_ == "backward_filter":
                _backward_filter(layer, ctx, x, y, w, algo)
            else:
                _backward_data(layer, ctx, y, w, x, algo)
            found.append((algo, time.perf_counter() - start, need))
        return sorted(found, key=lambda f: f[1])


def forward(layer: Conv2d, ctx: Ctx, x: np.ndarray, w: np.ndarray, y: np.ndarray, bias: np.ndarray | None) -> None:
    """``y = conv(x, w) + bias`` with ``ctx.algo``; tensors channels last, filters KRSC."""
    n, h, wd, c = x.shape
    k = layer.out_channels
    y2 = y.reshape(-1, k)
    if _grouped(layer):
        _grouped_accumulate(layer, ctx, x, y, w, forward=True)
    elif _is_gemm(layer):
        ctx.ops.matmul(x.reshape(-1, c), w.reshape(k, c).T, out=y2)
    elif ctx.algo == "implicit" or _implicit_only(layer):
        _implicit_accumulate(layer, ctx, x, y, lambda i, j: w[:, i, j, :].T, forward=True)
    elif ctx.algo == "winograd":
        nb, shared, lanes = _winograd_slots(layer, ctx, x.shape, "forward", x.dtype)
        _winograd.forward(x, w, bias, y, layer.padding, nb, shared, lanes, ctx.ops)
        return
    else:  # adds the bias to each chunk's output while it is in cache
        _forward_im2col(layer, ctx, x, w, y, bias)
        return
    if bias is not None:
        y2 += bias


def backward(
    layer: Conv2d,
    ctx: Ctx,
    dy: np.ndarray,
    x: np.ndarray | None,
    w: np.ndarray,
    dx: np.ndarray | None,
    dw: np.ndarray | None,
    db: np.ndarray | None,
) -> None:
    """``db`` (where given), ``dw`` (unless None: ``x`` is then given), then ``dx`` (unless None) with ``ctx.algo``: one name for both passes
    or a pair (backward_data, backward_filter)."""
    k, c = layer.out_channels, layer.in_channels
    dy2 = dy.reshape(-1, k)
    if db is not None:  # a GEMV with a ones vector: far faster than sum(axis=0)
        np.matmul(_ones(dy2.shape[0], dy2.dtype), dy2, out=db)
    if _is_gemm(layer) and not _grouped(layer):
        if dw is not None:
            assert x is not None, f"layer {layer.label}: the filters' gradient reads the input"
            ctx.ops.matmul(dy2.T, x.reshape(-1, c), out=dw.reshape(k, c))
        if dx is not None:
            ctx.ops.matmul(dy2, w.reshape(k, c), out=dx.reshape(-1, c))
        return
    algo_data, algo_filter = ctx.algo if isinstance(ctx.algo, tuple) else (ctx.algo, ctx.algo)
    if dw is not None:
        assert x is not None, f"layer {layer.label}: the filters' gradient reads the input"
        _backward_filter(layer, ctx, x, dy, dw, algo_filter)
    if dx is not None:
        _backward_data(layer, ctx, dy, w, dx, algo_data)


def _backward_filter(layer: Conv2d, ctx: Ctx, x: np.ndarray, dy: np.ndarray, dw: np.ndarray, algo: str | None) -> None:
    if _grouped(layer):
        _grouped_backward_filter(layer, ctx, x, dy, dw)
    elif _is_gemm(layer):
        k, c = layer.out_channels, layer.in_channels
        ctx.ops.matmul(dy.reshape(-1, k).T, x.reshape(-1, c), out=dw.reshape(k, c))
    elif algo == "implicit" or _implicit_only(layer):
        _backward_filter_implicit(layer, ctx, x, dy, dw)
    elif algo == "winograd":
        nb, shared, lanes = _winograd_slots(layer, ctx, x.shape, "backward_filter", x.dtype)
        _winograd.backward_filter(x, dy, dw, layer.padding, nb, shared, lanes, ctx.ops)
    else:
        _backward_filter_im2col(layer, ctx, x, dy, dw)


def _backward_data(layer: Conv2d, ctx: Ctx, dy: np.ndarray, w: np.ndarray, dx: np.ndarray, algo: str | None) -> None:
    if _grouped(layer):
        _grouped_accumulate(layer, ctx, dy, dx, w, forward=False)
    elif _is_gemm(layer):
        k, c = layer.out_channels, layer.in_channels
        ctx.ops.matmul(dy.reshape(-1, k), w.reshape(k, c), out=dx.reshape(-1, c))
    elif algo == "implicit" or _implicit_only(layer):
        _implicit_accumulate(layer, ctx, dy, dx, lambda i, j: w[:, i, j, :], forward=False)
    elif algo == "winograd":
        nb, shared, lanes = _winograd_slots(layer, ctx, dx.shape, "backward_data", dx.dtype)
        _winograd.backward_data(dy, w, dx, layer.padding, nb, shared, lanes, ctx.ops)
    elif _transposed_ok(layer):
        _backward_data_transposed(layer, ctx, dy, w, dx)
    else:
        _backward_data_col2im(layer, ctx, dy, w, dx)


# im2col ---------------------------------------------------------------------------------------------
# The column matrix is built a few images at a time (about 1M values a chunk) and consumed by the GEMM
# while it is still in cache: faster than one huge matrix, and a much smaller workspace. Each lane has its
# own slots. Forward and backward-data chunks write disjoint outputs, so the lanes pull them as they
# finish (``ctx.ops.pull``: a slowed core takes fewer); backward-filter's are dealt, chunk i to lane
# i % lanes, each lane summing its own partial filter gradient, so that the sums are added in an order
# fixed by the shapes. Either way the results do not depend on how the lanes run.
def _im2col_slots(
    layer: Conv2d, ctx: Ctx, x_shape: Shape, pass_: str, dtype: DTypeLike
) -> tuple[list[slice], dict[str, np.ndarray], list[dict[str, np.ndarray]]]:
    """An im2col pass's chunks (slices of the batch) and its workspace carved into named slots."""
    n, h, w, c = x_shape
    nb, shared, lanes = _im2col_layout(layer, (n, c, h, w), pass_)
    return [b for b, _ in _image_chunks(n, nb)], *_carve_slots(ctx, dtype, shared, lanes)


def _winograd_slots(
    layer: Conv2d, ctx: Ctx, x_shape: Shape, pass_: str, dtype: DTypeLike
) -> tuple[int, dict[str, np.ndarray], list[dict[str, np.ndarray]]]:
    """A Winograd pass's images per chunk and its workspace carved into named (flat) slots."""
    n, h, w, c = x_shape
    nb, shared, lanes = _winograd_layout(layer, (n, c, h, w), pass_)
    return nb, *_carve_slots(ctx, dtype, shared, lanes)


def _forward_im2col(
    layer: Conv2d, ctx: Ctx, x: np.ndarray, w: np.ndarray, y: np.ndarray, bias: np.ndarray | None
) -> None:
    chunks, _, lanes = _im2col_slots(layer, ctx, x.shape, "forward", x.dtype)
    k = layer.out_channels
    wmat = w.reshape(k, -1).T
    per = y.shape[1] * y.shape[2]

    def piece(i: int, j: int) -> None:
        slots, b = lanes[i], chunks[j]
        cb = slots["col"][: (b.stop - b.start) * per]
        _gather(x[b], slots.get("pad"), cb, layer.kernel_size, layer.stride, layer.padding)
        yb = y[b].reshape(-1, k)
        np.matmul(cb, wmat, out=yb)
        if bias is not None:
            yb += bias

    ctx.ops.pull(piece, len(chunks), len(lanes))


def _backward_filter_im2col(layer: Conv2d, ctx: Ctx, x: np.ndarray, dy: np.ndarray, dw: np.ndarray) -> None:
    chunks, _, lanes = _im2col_slots(layer, ctx, x.shape, "backward_filter", x.dtype)
    k = layer.out_channels
    dw2 = dw.reshape(k, -1)
    per = dy.shape[1] * dy.shape[2]

    def lane(i: int) -> None:
        slots = lanes[i]
        acc = slots.get("acc", dw2)
        for j, b in enumerate(chunks[i :: len(lanes)]):
            cb = slots["col"][: (b.stop - b.start) * per]
            _gather(x[b], slots.get("pad"), cb, layer.kernel_size, layer.stride, layer.padding)
            if j == 0:
                np.matmul(dy[b].reshape(-1, k).T, cb, out=acc)
            else:
                np.matmul(dy[b].reshape(-1, k).T, cb, out=slots["tmp"])
                acc += slots["tmp"]

    ctx.ops.run(lane, len(lanes))
    for slots in lanes[1:]:
        dw2 += slots["acc"]


def _backward_data_transposed(layer: Conv2d, ctx: Ctx, dy: np.ndarray, w: np.ndarray, dx: np.ndarray) -> None:
    n, h, wd, c = dx.shape
    chunks, shared, lanes = _im2col_slots(layer, ctx, dx.shape, "backward_data", dx.dtype)
    (kh, kw), (ph, pw) = layer.kernel_size, layer.padding
    k = layer.out_channels
    wflip = shared["wflip"]
    wflip.reshape(kh, kw, k, c)[...] = w[:, ::-1, ::-1, :].transpose(1, 2, 0, 3)

    def piece(i: int, j: int) -> None:
        slots, b = lanes[i], chunks[j]
        cb = slots["col"][: (b.stop - b.start) * h * wd]
        _gather(dy[b], slots.get("pad"), cb, layer.kernel_size, (1, 1), (kh - 1 - ph, kw - 1 - pw))
        np.matmul(cb, wflip, out=dx[b].reshape(-1, c))

    ctx.ops.pull(piece, len(chunks), len(lanes))


def _backward_data_col2im(layer: Conv2d, ctx: Ctx, dy: np.ndarray, w: np.ndarray, dx: np.ndarray) -> None:
    """Strided convolutions: columns of d(input) from a GEMM, scattered back window by window."""
    n, h, wd, c = dx.shape
    _, ho, wo, k = dy.shape
    chunks, _, lanes = _im2col_slots(layer, ctx, dx.shape, "backward_data", dx.dtype)
    (kh, kw), (sh, sw), (ph, pw) = layer.kernel_size, layer.stride, layer.padding
    wmat = w.reshape(k, -1)

    def piece(i: int, j: int) -> None:
        slots, b = lanes[i], chunks[j]
        rows = b.stop - b.start
        dcol = slots["col"][: rows * ho * wo]
        np.matmul(dy[b].reshape(-1, k), wmat, out=dcol)
        d6 = dcol.reshape(rows, ho, wo, kh, kw, c)
        dpad = slots.get("pad")
        target = dx[b] if dpad is None else dpad[:rows]
        target.fill(0)
        for p in range(kh):
            for q in range(kw):
                target[:, p : p + sh * (ho - 1) + 1 : sh, q : q + sw * (wo - 1) + 1 : sw, :] += d6[:, :, :, p, q, :]
        if dpad is not None:
            dx[b] = target[:, ph : ph + h, pw : pw + wd, :]

    ctx.ops.pull(piece, len(chunks), len(lanes))


def _chunks(n: int, ho: int, wo: int) -> Iterator[slice]:
    step = _chunk(n, ho, wo)
    for lo in range(0, n, step):
        yield slice(lo, min(lo + step, n))


def _regions(layer: Conv2d, h: int, w: int, ho: int, wo: int) -> Iterator[tuple[Any, ...]]:
    """For each filter offset: the output rows/cols it touches and the matching input slices."""
    (kh, kw), (sh, sw), (ph, pw) = layer.kernel_size, layer.stride, layer.padding
    dh, dw = getattr(layer, "dilation", (1, 1))
    for i in range(kh):
        o0, o1 = _span(i * dh, ph, sh, h, ho)
        if o0 >= o1:
            continue
        for j in range(kw):
            p0, p1 = _span(j * dw, pw, sw, w, wo)
            if p0 >= p1:
                continue
            rows = slice(o0 * sh + i * dh - ph, (o1 - 1) * sh + i * dh - ph + 1, sh)
            cols = slice(p0 * sw + j * dw - pw, (p1 - 1) * sw + j * dw - pw + 1, sw)
            yield i, j, slice(o0, o1), slice(p0, p1), rows, cols


def _implicit_accumulate(layer: Conv2d, ctx: Ctx, src: np.ndarray, dst: np.ndarray, matrix: Any, forward: bool) -> None:
    """dst = sum over filter offsets of shifted(src) @ matrix(offset), a few images at a time.

    Forward: src is x, dst is y, and the input region of each offset maps to its output region;
    backward-data runs the same map the other way (src dy, dst dx)."""
    _shifted_products(layer, ctx, src, dst, lambda a, i, j, out: np.matmul(a, matrix(i, j), out=out), forward)


def _shifted_products(layer: Conv2d, ctx: Ctx, src: np.ndarray, dst: np.ndarray, product: Any, forward: bool) -> None:
    """dst = sum over filter offsets (i, j) of ``product(shifted region of src as rows, i, j, out)``: the
    implicit algorithm's loop, a few images at a time, the region copied into the workspace."""
    x_shape, y_shape = (src.shape, dst.shape) if forward else (dst.shape, src.shape)
    n, h, wd, _ = x_shape
    _, ho, wo, _ = y_shape
    cin, cout = src.shape[3], dst.shape[3]
    rows = _chunk(n, ho, wo) * ho * wo
    tin, tout = _carve(ctx.workspace, src.dtype, (rows, cin), (rows, cout))
    dst.fill(0)
    for b in _chunks(n, ho, wo):
        sb, db = src[b], dst[b]
        for i, j, orow, ocol, irow, icol in _regions(layer, h, wd, ho, wo):
            (sr, sc), (dr, dc) = ((irow, icol), (orow, ocol)) if forward else ((orow, ocol), (irow, icol))
            region = sb[:, sr, sc, :]
            m = region.shape[0] * region.shape[1] * region.shape[2]
            a = tin[:m].reshape(region.shape)
            np.copyto(a, region)
            out = tout[:m]
            product(a.reshape(m, cin), i, j, out)
            db[:, dr, dc, :] += out.reshape(region.shape[:3] + (cout,))


def _backward_filter_implicit(layer: Conv2d, ctx: Ctx, x: np.ndarray, dy: np.ndarray, dw: np.ndarray) -> None:
    k, c = dy.shape[3], x.shape[3]
    _filter_products(layer, ctx, x, dy, dw, (k, c), lambda d, a, tw: np.matmul(d.T, a, out=tw))


def _filter_products(
    layer: Conv2d, ctx: Ctx, x: np.ndarray, dy: np.ndarray, dw: np.ndarray, per: Shape, product: Any
) -> None:
    """dW[:, i, j, :] = sum over a few images at a time of ``product(dy rows, shifted x rows, out)`` for each
    filter offset (i, j): the implicit algorithm's filter gradient, ``out`` of shape ``per`` in the workspace."""
    n, h, wd, c = x.shape
    _, ho, wo, k = dy.shape
    rows = _chunk(n, ho, wo) * ho * wo
    tin, tdy, tw = _carve(ctx.workspace, x.dtype, (rows, c), (rows, k), per)
    dw.fill(0)
    for b in _chunks(n, ho, wo):
        xb, dyb = x[b], dy[b]
        for i, j, orow, ocol, irow, icol in _regions(layer, h, wd, ho, wo):
            xr = xb[:, irow, icol, :]
            m = xr.shape[0] * xr.shape[1] * xr.shape[2]
            a = tin[:m].reshape(xr.shape)
            np.copyto(a, xr)
            d = tdy[:m].reshape(xr.shape[:3] + (k,))
            np.copyto(d, dyb[:, orow, ocol, :])
            product(d.reshape(m, k), a.reshape(m, c), tw)
            dw[:, i, j, :] += tw


# grouped --------------------------------------------------------------------------------------------
# The implicit algorithm over g groups: for each filter offset, the shifted region of a few images (rows of
# C = g * cg channels) times the offset's filters, one product per group (np.matmul over a group axis),
# or, for a depthwise convolution (one input and one output channel a group), an element-wise product.
def _grouped_accumulate(
    layer: Conv2d, ctx: Ctx, src: np.ndarray, dst: np.ndarray, w: np.ndarray, forward: bool
) -> None:
    """dst = sum over filter offsets of shifted(src) times the offset's filters, group by group (forward:
    src x, dst y; backward-data: src dy, dst dx, the map run the other way)."""
    g = layer.groups
    kg, cg = layer.out_channels // g, layer.in_channels // g
    sin, sout = (cg, kg) if forward else (kg, cg)  # per group: the channels read and written

    def product(a: np.ndarray, i: int, j: int, out: np.ndarray) -> None:
        wij = w[:, i, j, :]  # (K, cg): group q's filters are rows q*kg .. (q+1)*kg
        if kg == 1 and cg == 1:  # depthwise
            np.multiply(a, wij[:, 0], out=out)
            return
        per = wij.reshape(g, kg, cg)
        m = a.shape[0]
        np.matmul(
            a.reshape(m, g, sin).transpose(1, 0, 2),
            per.transpose(0, 2, 1) if forward else per,
            out=out.reshape(m, g, sout).transpose(1, 0, 2),
        )

    _shifted_products(layer, ctx, src, dst, product, forward)


def _grouped_backward_filter(layer: Conv2d, ctx: Ctx, x: np.ndarray, dy: np.ndarray, dw: np.ndarray) -> None:
    g = layer.groups
    k, c = dy.shape[3], x.shape[3]
    kg, cg = k // g, c // g

    def product(d: np.ndarray, a: np.ndarray, tw: np.ndarray) -> None:
        m = d.shape[0]
        if kg == 1 and cg == 1:  # depthwise: each channel's filter is the sum over rows of dy * x
            np.multiply(d, a, out=d)
            np.matmul(_ones(m, d.dtype), d, out=tw.reshape(k))
            return
        np.matmul(
            d.reshape(m, g, kg).transpose(1, 2, 0), a.reshape(m, g, cg).transpose(1, 0, 2), out=tw.reshape(g, kg, cg)
        )

    _filter_products(layer, ctx, x, dy, dw, (k, cg), product)


# workspace ------------------------------------------------------------------------------------------
def _carve(ws: np.ndarray | None, dtype: DTypeLike, *shapes: Shape) -> list[np.ndarray]:
    """Split a uint8 workspace into arrays of ``shapes`` (each start aligned to 64 bytes)."""
    out, offset = [], 0
    itemsize = np.dtype(dtype).itemsize
    for shape in shapes:
        n = int(np.prod(shape)) * itemsize
        if ws is None or offset + n > ws.nbytes:
            have = 0 if ws is None else ws.nbytes
            raise ValueError(f"convolution workspace too small: need at least {offset + n} bytes, have {have}")
        out.append(ws[offset : offset + n].view(dtype).reshape(shape))
        offset += -(-n // _ALIGN) * _ALIGN
    return out


def _carve_slots(
    ctx: Ctx, dtype: DTypeLike, shared: dict[str, Shape], lanes: list[dict[str, Shape]]
) -> tuple[dict[str, np.ndarray], list[dict[str, np.ndarray]]]:
    """A layout's slots carved from the pass's workspace, in :func:`_flat`'s order: (shared, each lane's)."""
    arrays = iter(_carve(ctx.workspace, dtype, *_flat(shared, lanes)))
    return {name: next(arrays) for name in shared}, [{name: next(arrays) for name in slots} for slots in lanes]
