"""2-D convolution with a catalog of algorithms that trade workspace for speed.

On the CPU (NumPy, channels-last) there are two algorithms for each pass:

* ``im2col``: gather the receptive fields of a few images into a column matrix (about 1M values, so it
  is still in cache when the GEMM reads it), then one GEMM per chunk. The fastest; its workspace is the
  column chunk plus a zero-padded copy of the chunk's images. With stride 1, backward-data is the same
  thing applied to dy with the filters flipped (a "full" convolution), which avoids scattering columns
  back; strided convolutions scatter (col2im).
* ``implicit``: for each of the kh*kw filter offsets, one GEMM over the shifted input region,
  accumulated into the output, a few images at a time (enough for 4,096 output rows). The workspace
  holds one region of those images (for 3x3 filters about 9C/(C+K) times less than im2col's columns
  for the same rows), and it is slower.

* ``winograd`` (3x3 kernels, stride 1, padding up to 2, at least 16 channels in and out): Winograd's
  F(2x2, 3x3), 2.25x fewer multiply-adds than im2col in 16 GEMMs over transformed tiles (see
  :mod:`vmem.nn.winograd`); its workspace holds a chunk's transformed tiles and the transformed filters.

A 1x1 convolution with stride 1 and no padding is a plain GEMM for all, with no workspace. All give
the same results up to float32 rounding. This catalog is what memory-optimal versus performance-optimal
selection acts on; the CUDA device offers cuDNN's algorithms under the same protocol.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..errors import ShapeError
from .base import PASSES, Ctx, Layer, ParamSpec, Shape
from . import lanes as _lanes
from . import winograd as _winograd
from .conv_arrays import _image_chunks, _ones, _gather, _span

__all__ = ["Conv2d", "ALGORITHMS"]

#: Algorithms of the CPU catalog, fastest first (a convolution is offered those that apply to it).
ALGORITHMS = ("winograd", "im2col", "implicit")
_ALIGN = 64
_IMPLICIT_ROWS = 4096  # output rows per GEMM step of the implicit algorithm
_COL_VALUES = 1 << 20  # values per im2col chunk (4 MiB in float32): stays in cache for its GEMM
_COL_MIN_ROWS = 2048  # ... but no fewer rows than this, so that each GEMM stays efficient


def _pair(v: int | Sequence[int], name: str) -> tuple[int, int]:
    if isinstance(v, int):
        return (v, v)
    v = tuple(v)
    if len(v) != 2 or not all(isinstance(i, int) for i in v):
        raise ValueError(f"{name}={v!r}: expected an int or a pair of ints")
    return v  # type: ignore[return-value]


def _carve(ws: np.ndarray | None, dtype: Any, *shapes: Shape) -> list[np.ndarray]:
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


def _ws_bytes(itemsize: int, *shapes: Shape) -> int:
    return sum(-(-int(np.prod(s)) * itemsize // _ALIGN) * _ALIGN for s in shapes)


class Conv2d(Layer):
    """2-D convolution ``Conv2d(in_channels, out_channels, kernel_size, stride=1, padding=0, bias=True)``.

    Input (N, C, H, W), output (N, K, Ho, Wo) with Ho = (H + 2p - kh) // s + 1. Backward needs the input.
    Parameters: ``weight`` (K, kh, kw, C) and ``bias`` (K,).
    """

    kind = "conv"
    needs = frozenset({"x"})

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] = 0,
        bias: bool = True,
    ):
        super().__init__()
        for name, v in (("in_channels", in_channels), ("out_channels", out_channels)):
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"Conv2d: {name}={v!r} must be a positive int")
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = _pair(kernel_size, "kernel_size")
        self.stride = _pair(stride, "stride")
        self.padding = _pair(padding, "padding")
        if min(self.kernel_size) < 1 or min(self.stride) < 1 or min(self.padding) < 0:
            raise ValueError(
                f"Conv2d: bad geometry kernel={self.kernel_size} stride={self.stride} padding={self.padding}"
            )
        self.bias = bias

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, padding={self.padding}" + ("" if self.bias else ", bias=False")
        )

    # -- shapes ------------------------------------------------------------------------------------
    def output_shape(self, in_shapes: Sequence[Shape]) -> Shape:
        self.check_arity(in_shapes)
        shape = in_shapes[0]
        self.expect_rank(shape, 4)
        n, c, h, w = shape
        if c != self.in_channels:
            raise ShapeError(
                f"layer {self.label}: expects input of shape (N, {self.in_channels}, H, W), got {tuple(shape)}"
            )
        (kh, kw), (sh, sw), (ph, pw) = self.kernel_size, self.stride, self.padding
        ho, wo = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
        if ho < 1 or wo < 1:
            raise ShapeError(
                f"layer {self.label}: a {kh}x{kw} kernel with padding {self.padding} does not fit input "
                f"of shape {tuple(shape)}"
            )
        return (n, self.out_channels, ho, wo)

    def param_specs(self, in_shapes: Sequence[Shape]) -> dict[str, ParamSpec]:
        kh, kw = self.kernel_size
        fan_in = self.in_channels * kh * kw
        fan_out = self.out_channels * kh * kw
        specs = {"weight": ParamSpec((self.out_channels, kh, kw, self.in_channels), "he", fan_in, fan_out)}
        if self.bias:
            specs["bias"] = ParamSpec((self.out_channels,), "zeros")
        return specs

    def flops(self, in_shapes: Sequence[Shape]) -> int:
        n, k, ho, wo = self.output_shape(in_shapes)
        kh, kw = self.kernel_size
        return 2 * n * k * ho * wo * self.in_channels * kh * kw

    # -- algorithms --------------------------------------------------------------------------------
    def _is_gemm(self) -> bool:
        return self.kernel_size == (1, 1) and self.stride == (1, 1) and self.padding == (0, 0)

    def _winograd_applies(self) -> bool:
        return _winograd.applies(self.kernel_size, self.stride, self.padding)

    def algorithms(self, in_shapes: Sequence[Shape]) -> dict[str, list[str]]:
        offered = [
            a
            for a in ALGORITHMS
            if a != "winograd"
            or (self._winograd_applies() and _winograd.worthwhile(self.in_channels, self.out_channels))
        ]
        return {p: list(offered) for p in PASSES}

    def _geometry(self, in_shape: Shape) -> tuple[int, ...]:
        n, c, h, w = in_shape
        _, k, ho, wo = self.output_shape([in_shape])
        return n, c, h, w, k, ho, wo

    def _im2col_layout(self, in_shape: Shape, pass_: str) -> tuple[int, dict[str, Shape], list[dict[str, Shape]]]:
        """An im2col pass's chunking and workspace: (images per chunk, shared slots, each lane's slots).

        Each lane has a padded copy of its chunk's images (``pad``, where the convolution pads) and the
        chunk's columns (``col``); backward-filter adds the lane's own partial gradient (``acc``, except
        lane 0, which sums into dW itself) and a product to add in (``tmp``, where the lane has several
        chunks); backward-data by transposed convolution shares the flipped filters (``wflip``)."""
        n, c, h, w, k, ho, wo = self._geometry(in_shape)
        (kh, kw), (ph, pw) = self.kernel_size, self.padding
        shared: dict[str, Shape] = {}
        if pass_ == "backward_data" and self._transposed_ok():
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
        lanes = []
        for lane in range(min(ways, chunks)):
            slots = {"pad": pad} if pad is not None else {}
            slots["col"] = col
            if pass_ == "backward_filter":
                if lane:
                    slots["acc"] = (k, kh * kw * c)
                if len(range(lane, chunks, ways)) > 1:
                    slots["tmp"] = (k, kh * kw * c)
            lanes.append(slots)
        return nb, shared, lanes

    def _winograd_layout(self, in_shape: Shape, pass_: str) -> tuple[int, dict[str, Shape], list[dict[str, Shape]]]:
        """A Winograd pass's chunking and workspace slots (see :func:`vmem.nn.winograd.layout`)."""
        if not self._winograd_applies():
            raise ValueError(
                f"layer {self.label}: the winograd algorithm needs a 3x3 kernel, stride 1 and "
                f"padding at most 2, not kernel={self.kernel_size} stride={self.stride} "
                f"padding={self.padding}"
            )
        n, c, h, w, k, ho, wo = self._geometry(in_shape)
        ways = _lanes.lanes_for(n * ho * wo * 9 * c * k)
        nb, shared, lanes = _winograd.layout(n, c, h, w, k, ho, wo, pass_, ways)
        return (
            nb,
            {name: (v,) for name, v in shared.items()},
            [{name: (v,) for name, v in slots.items()} for slots in lanes],
        )

    def _workspace_shapes(self, in_shape: Shape, pass_: str, algo: str | None) -> list[Shape]:
        if self._is_gemm():
            return []
        n, c, h, w, k, ho, wo = self._geometry(in_shape)
        if algo == "winograd":
            return _flat(*self._winograd_layout(in_shape, pass_)[1:])
        if algo in (None, "im2col"):
            return _flat(*self._im2col_layout(in_shape, pass_)[1:])
        if algo == "implicit":
            rows = self._chunk(n, ho, wo) * ho * wo
            if pass_ == "forward":
                return [(rows, c), (rows, k)]
            if pass_ == "backward_data":
                return [(rows, k), (rows, c)]
            return [(rows, c), (rows, k), (k, c)]
        raise ValueError(f"layer {self.label}: unknown convolution algorithm {algo!r}; use one of {ALGORITHMS}")

    def workspace_bytes(self, in_shapes: Sequence[Shape], pass_: str, algo: str | None, itemsize: int) -> int:
        return _ws_bytes(itemsize, *self._workspace_shapes(in_shapes[0], pass_, algo))

    # -- math --------------------------------------------------------------------------------------
    def forward(self, ctx: Ctx, xs: list[Any], y: Any) -> None:
        x = xs[0]
        w = ctx.params["weight"]
        n, h, wd, c = x.shape
        k = self.out_channels
        y2 = y.reshape(-1, k)
        if ctx.conv is not None:  # the device's own convolutions (cuDNN)
            ctx.conv.forward(self, ctx, x, w, y)
        elif self._is_gemm():
            ctx.ops.matmul(x.reshape(-1, c), w.reshape(k, c).T, out=y2)
        elif ctx.algo == "implicit":
            self._forward_implicit(ctx, x, w, y)
        elif ctx.algo == "winograd":
            nb, shared, lanes = self._winograd_slots(ctx, x.shape, "forward", x.dtype)
            _winograd.forward(
                x, w, ctx.params["bias"] if self.bias else None, y, self.padding, nb, shared, lanes, ctx.ops
            )
            return
        else:  # adds the bias to each chunk's output while it is in cache
            self._forward_im2col(ctx, x, w, y, ctx.params["bias"] if self.bias else None)
            return
        if self.bias:
            y2 += ctx.params["bias"]

    def backward(self, ctx: Ctx, dy: Any, xs: list[Any] | None, y: Any | None, dxs: list[Any | None]) -> None:
        """``ctx.algo`` is one algorithm for both passes or a pair (backward_data, backward_filter); the
        two passes run one after the other in the same workspace."""
        x = xs[0]  # type: ignore[index]
        dx = dxs[0]
        w = ctx.params["weight"]
        k = self.out_channels
        c = self.in_channels
        dy2 = dy.reshape(-1, k)
        dw = ctx.grads["weight"]
        if ctx.conv is not None:  # the device's own convolutions (cuDNN), the bias's gradient too
            ctx.conv.backward(self, ctx, dy, x, w, dx, dw, ctx.grads["bias"] if self.bias else None)
            return
        if self.bias:  # a GEMV with a ones vector: far faster than sum(axis=0)
            np.matmul(_ones(dy2.shape[0], dy2.dtype), dy2, out=ctx.grads["bias"])
        if self._is_gemm():
            ctx.ops.matmul(dy2.T, x.reshape(-1, c), out=dw.reshape(k, c))
            if dx is not None:
                ctx.ops.matmul(dy2, w.reshape(k, c), out=dx.reshape(-1, c))
            return
        algo_data, algo_filter = ctx.algo if isinstance(ctx.algo, tuple) else (ctx.algo, ctx.algo)
        if algo_filter == "implicit":
            self._backward_filter_implicit(ctx, x, dy, dw)
        elif algo_filter == "winograd":
            nb, shared, lanes = self._winograd_slots(ctx, x.shape, "backward_filter", x.dtype)
            _winograd.backward_filter(x, dy, dw, self.padding, nb, shared, lanes, ctx.ops)
        else:
            self._backward_filter_im2col(ctx, x, dy, dw)
        if dx is None:
            return
        if algo_data == "implicit":
            self._backward_data_implicit(ctx, dy, w, dx)
        elif algo_data == "winograd":
            nb, shared, lanes = self._winograd_slots(ctx, dx.shape, "backward_data", dx.dtype)
            _winograd.backward_data(dy, w, dx, self.padding, nb, shared, lanes, ctx.ops)
        elif self._transposed_ok():
            self._backward_data_transposed(ctx, dy, w, dx)
        else:
            self._backward_data_col2im(ctx, dy, w, dx)

    # im2col ---------------------------------------------------------------------------------------
    # The column matrix is built a few images at a time (about 1M values a chunk) and consumed by the
    # GEMM while it is still in cache: faster than one huge matrix, and a much smaller workspace. Each
    # lane has its own slots. Forward and backward-data chunks write disjoint outputs, so the lanes
    # pull them as they finish (``ctx.ops.pull``: a slowed core takes fewer); backward-filter's are
    # dealt, chunk i to lane i % lanes, each lane summing its own partial filter gradient, so that the
    # sums are added in an order fixed by the shapes. Either way the results do not depend on how the
    # lanes run.
    def _im2col_slots(
        self, ctx: Ctx, x_shape: Shape, pass_: str, dtype: Any
    ) -> tuple[list[slice], dict[str, np.ndarray], list[dict[str, np.ndarray]]]:
        """An im2col pass's chunks (slices of the batch) and its workspace carved into named slots."""
        n, h, w, c = x_shape
        nb, shared, lanes = self._im2col_layout((n, c, h, w), pass_)
        return [b for b, _ in _image_chunks(n, nb)], *_carve_slots(ctx, dtype, shared, lanes)

    def _winograd_slots(
        self, ctx: Ctx, x_shape: Shape, pass_: str, dtype: Any
    ) -> tuple[int, dict[str, np.ndarray], list[dict[str, np.ndarray]]]:
        """A Winograd pass's images per chunk and its workspace carved into named (flat) slots."""
        n, h, w, c = x_shape
        nb, shared, lanes = self._winograd_layout((n, c, h, w), pass_)
        return nb, *_carve_slots(ctx, dtype, shared, lanes)

    def _forward_im2col(self, ctx: Ctx, x: np.ndarray, w: np.ndarray, y: np.ndarray, bias: np.ndarray | None) -> None:
        chunks, _, lanes = self._im2col_slots(ctx, x.shape, "forward", x.dtype)
        k = self.out_channels
        wmat = w.reshape(k, -1).T
        per = y.shape[1] * y.shape[2]

        def piece(i: int, j: int) -> None:
            slots, b = lanes[i], chunks[j]
            cb = slots["col"][: (b.stop - b.start) * per]
            _gather(x[b], slots.get("pad"), cb, self.kernel_size, self.stride, self.padding)
            yb = y[b].reshape(-1, k)
            np.matmul(cb, wmat, out=yb)
            if bias is not None:
                yb += bias

        ctx.ops.pull(piece, len(chunks), len(lanes))

    def _backward_filter_im2col(self, ctx: Ctx, x: np.ndarray, dy: np.ndarray, dw: np.ndarray) -> None:
        chunks, _, lanes = self._im2col_slots(ctx, x.shape, "backward_filter", x.dtype)
        k = self.out_channels
        dw2 = dw.reshape(k, -1)
        per = dy.shape[1] * dy.shape[2]

        def lane(i: int) -> None:
            slots = lanes[i]
            acc = slots.get("acc", dw2)
            for j, b in enumerate(chunks[i :: len(lanes)]):
                cb = slots["col"][: (b.stop - b.start) * per]
                _gather(x[b], slots.get("pad"), cb, self.kernel_size, self.stride, self.padding)
                if j == 0:
                    np.matmul(dy[b].reshape(-1, k).T, cb, out=acc)
                else:
                    np.matmul(dy[b].reshape(-1, k).T, cb, out=slots["tmp"])
                    acc += slots["tmp"]

        ctx.ops.run(lane, len(lanes))
        for slots in lanes[1:]:
            dw2 += slots["acc"]

    def _transposed_ok(self) -> bool:
        """Backward-data as a forward convolution of dy with flipped filters: stride 1, padding < kernel."""
        return self.stride == (1, 1) and self.padding[0] < self.kernel_size[0] and self.padding[1] < self.kernel_size[1]

    def _backward_data_transposed(self, ctx: Ctx, dy: np.ndarray, w: np.ndarray, dx: np.ndarray) -> None:
        n, h, wd, c = dx.shape
        chunks, shared, lanes = self._im2col_slots(ctx, dx.shape, "backward_data", dx.dtype)
        (kh, kw), (ph, pw) = self.kernel_size, self.padding
        k = self.out_channels
        wflip = shared["wflip"]
        wflip.reshape(kh, kw, k, c)[...] = w[:, ::-1, ::-1, :].transpose(1, 2, 0, 3)

        def piece(i: int, j: int) -> None:
            slots, b = lanes[i], chunks[j]
            cb = slots["col"][: (b.stop - b.start) * h * wd]
            _gather(dy[b], slots.get("pad"), cb, self.kernel_size, (1, 1), (kh - 1 - ph, kw - 1 - pw))
            np.matmul(cb, wflip, out=dx[b].reshape(-1, c))

        ctx.ops.pull(piece, len(chunks), len(lanes))

    def _backward_data_col2im(self, ctx: Ctx, dy: np.ndarray, w: np.ndarray, dx: np.ndarray) -> None:
        """Strided convolutions: columns of d(input) from a GEMM, scattered back window by window."""
        n, h, wd, c = dx.shape
        _, ho, wo, k = dy.shape
        chunks, _, lanes = self._im2col_slots(ctx, dx.shape, "backward_data", dx.dtype)
        (kh, kw), (sh, sw), (ph, pw) = self.kernel_size, self.stride, self.padding
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

    # implicit -------------------------------------------------------------------------------------
    @staticmethod
    def _chunk(n: int, ho: int, wo: int) -> int:
        """Images per step of the implicit algorithm: enough output rows (>= 4096) to keep a GEMM
        efficient, no more, so that its workspace stays small whatever the batch."""
        return min(n, -(-_IMPLICIT_ROWS // (ho * wo)))

    def _chunks(self, n: int, ho: int, wo: int):
        step = self._chunk(n, ho, wo)
        for lo in range(0, n, step):
            yield slice(lo, min(lo + step, n))

    def _regions(self, h: int, w: int, ho: int, wo: int):
        """For each filter offset: the output rows/cols it touches and the matching input slices."""
        (kh, kw), (sh, sw), (ph, pw) = self.kernel_size, self.stride, self.padding
        for i in range(kh):
            o0, o1 = _span(i, ph, sh, h, ho)
            if o0 >= o1:
                continue
            for j in range(kw):
                p0, p1 = _span(j, pw, sw, w, wo)
                if p0 >= p1:
                    continue
                rows = slice(o0 * sh + i - ph, (o1 - 1) * sh + i - ph + 1, sh)
                cols = slice(p0 * sw + j - pw, (p1 - 1) * sw + j - pw + 1, sw)
                yield i, j, slice(o0, o1), slice(p0, p1), rows, cols

    def _forward_implicit(self, ctx: Ctx, x: np.ndarray, w: np.ndarray, y: np.ndarray) -> None:
        self._implicit_accumulate(ctx, x, y, lambda i, j: w[:, i, j, :].T, forward=True)

    def _backward_data_implicit(self, ctx: Ctx, dy: np.ndarray, w: np.ndarray, dx: np.ndarray) -> None:
        self._implicit_accumulate(ctx, dy, dx, lambda i, j: w[:, i, j, :], forward=False)

    def _implicit_accumulate(self, ctx: Ctx, src: np.ndarray, dst: np.ndarray, matrix: Any, forward: bool) -> None:
        """dst = sum over filter offsets of shifted(src) @ matrix(offset), a few images at a time.

        Forward: src is x, dst is y, and the input region of each offset maps to its output region;
        backward-data runs the same map the other way (src dy, dst dx)."""
        x_shape, y_shape = (src.shape, dst.shape) if forward else (dst.shape, src.shape)
        n, h, wd, _ = x_shape
        _, ho, wo, _ = y_shape
        cin, cout = src.shape[3], dst.shape[3]
        rows = self._chunk(n, ho, wo) * ho * wo
        tin, tout = _carve(ctx.workspace, src.dtype, (rows, cin), (rows, cout))
        dst.fill(0)
        for b in self._chunks(n, ho, wo):
            sb, db = src[b], dst[b]
            for i, j, orow, ocol, irow, icol in self._regions(h, wd, ho, wo):
                (sr, sc), (dr, dc) = ((irow, icol), (orow, ocol)) if forward else ((orow, ocol), (irow, icol))
                region = sb[:, sr, sc, :]
                m = region.shape[0] * region.shape[1] * region.shape[2]
                a = tin[:m].reshape(region.shape)
                np.copyto(a, region)
                out = tout[:m]
                np.matmul(a.reshape(m, cin), matrix(i, j), out=out)
                db[:, dr, dc, :] += out.reshape(region.shape[:3] + (cout,))

    def _backward_filter_implicit(self, ctx: Ctx, x: np.ndarray, dy: np.ndarray, dw: np.ndarray) -> None:
        n, h, wd, c = x.shape
        _, ho, wo, k = dy.shape
        rows = self._chunk(n, ho, wo) * ho * wo
        tin, tdy, tw = _carve(ctx.workspace, x.dtype, (rows, c), (rows, k), (k, c))
        dw.fill(0)
        for b in self._chunks(n, ho, wo):
            xb, dyb = x[b], dy[b]
            for i, j, orow, ocol, irow, icol in self._regions(h, wd, ho, wo):
                xr = xb[:, irow, icol, :]
                m = xr.shape[0] * xr.shape[1] * xr.shape[2]
                a = tin[:m].reshape(xr.shape)
                np.copyto(a, xr)
                d = tdy[:m].reshape(xr.shape[:3] + (k,))
                np.copyto(d, dyb[:, orow, ocol, :])
                np.matmul(d.reshape(m, k).T, a.reshape(m, c), out=tw)
                dw[:, i, j, :] += tw


def _flat(shared: dict[str, Shape], lanes: list[dict[str, Shape]]) -> list[Shape]:
    """A layout's slot shapes (im2col's or Winograd's) in workspace order: the shared slots, then each lane's."""
    return list(shared.values()) + [shape for slots in lanes for shape in slots.values()]


def _carve_slots(
    ctx: Ctx, dtype: Any, shared: dict[str, Shape], lanes: list[dict[str, Shape]]
) -> tuple[dict[str, np.ndarray], list[dict[str, np.ndarray]]]:
    """A layout's slots carved from the pass's workspace, in :func:`_flat`'s order: (shared, each lane's)."""
    arrays = iter(_carve(ctx.workspace, dtype, *_flat(shared, lanes)))
    return {name: next(arrays) for name in shared}, [{name: next(arrays) for name in slots} for slots in lanes]


def _col_images(n: int, ho: int, wo: int, width: int) -> int:
    """Images per chunk of an im2col column matrix ``width`` values wide (about _COL_VALUES values)."""
    rows = max(_COL_MIN_ROWS, _COL_VALUES // width)
    return min(n, max(1, -(-rows // (ho * wo))))
