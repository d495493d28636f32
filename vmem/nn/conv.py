"""2-D convolution with a catalog of algorithms that trade workspace for speed.

On the CPU (NumPy, channels-last) there are two algorithms for each pass:

* ``im2col``: gather every receptive field into one matrix (the workspace: N*Ho*Wo*kh*kw*C values, plus
  a zero-padded copy of the input when padding), then one GEMM. Fast, large workspace. With stride 1,
  backward-data is the same thing applied to dy with the filters flipped (a "full" convolution), which
  avoids scattering columns back; strided convolutions scatter (col2im).
* ``implicit``: for each of the kh*kw filter offsets, one GEMM over the shifted input region,
  accumulated into the output, a few images at a time (enough for 4,096 output rows). The workspace
  holds one region of those images: small and independent of the batch size, and slower.

A 1x1 convolution with stride 1 and no padding is a plain GEMM for both, with no workspace. Both give
the same results up to float32 rounding. This catalog is what memory-optimal versus performance-optimal
selection acts on; the CUDA device offers cuDNN's algorithms under the same protocol.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..errors import ShapeError
from .base import Ctx, Layer, ParamSpec, Shape

__all__ = ["Conv2d", "ALGORITHMS"]

#: Algorithms of the CPU catalog, fastest first.
ALGORITHMS = ("im2col", "implicit")
PASSES = ("forward", "backward_data", "backward_filter")
_ALIGN = 64
_IMPLICIT_ROWS = 4096  # output rows per GEMM step of the implicit algorithm


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

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | Sequence[int],
                 stride: int | Sequence[int] = 1, padding: int | Sequence[int] = 0, bias: bool = True):
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
            raise ValueError(f"Conv2d: bad geometry kernel={self.kernel_size} stride={self.stride} padding={self.padding}")
        self.bias = bias

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}" + ("" if self.bias else ", bias=False"))

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

    def algorithms(self, in_shapes: Sequence[Shape]) -> dict[str, list[str]]:
        return {p: list(ALGORITHMS) for p in PASSES}

    def _geometry(self, in_shape: Shape) -> tuple[int, ...]:
        n, c, h, w = in_shape
        _, k, ho, wo = self.output_shape([in_shape])
        return n, c, h, w, k, ho, wo

    def _workspace_shapes(self, in_shape: Shape, pass_: str, algo: str | None) -> list[Shape]:
        if self._is_gemm():
            return []
        n, c, h, w, k, ho, wo = self._geometry(in_shape)
        (kh, kw), (ph, pw) = self.kernel_size, self.padding
        if algo in (None, "im2col"):
            if pass_ == "backward_data" and self._transposed_ok():
                # dx = im2col(dy padded by k-1-p) @ flipped filters: (pad buffer), columns, flipped filters
                qh, qw = kh - 1 - ph, kw - 1 - pw
                shapes = [(n * h * w, kh * kw * k), (kh * kw * k, c)]
                if qh or qw:
                    shapes.insert(0, (n, ho + 2 * qh, wo + 2 * qw, k))
                return shapes
            shapes = [(n * ho * wo, kh * kw * c)]
            if ph or pw:
                shapes.insert(0, (n, h + 2 * ph, w + 2 * pw, c))
            return shapes
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
        if self._is_gemm():
            np.matmul(x.reshape(-1, c), w.reshape(k, c).T, out=y2)
        elif ctx.algo == "implicit":
            self._forward_implicit(ctx, x, w, y)
        else:
            col = self._im2col(ctx, x, pass_="forward")
            np.matmul(col, w.reshape(k, -1).T, out=y2)
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
        if self.bias:  # a GEMV with a ones vector: BLAS runs it threaded, far faster than sum(axis=0)
            np.matmul(_ones(dy2.shape[0], dy2.dtype), dy2, out=ctx.grads["bias"])
        dw = ctx.grads["weight"]
        if self._is_gemm():
            np.matmul(dy2.T, x.reshape(-1, c), out=dw.reshape(k, c))
            if dx is not None:
                np.matmul(dy2, w.reshape(k, c), out=dx.reshape(-1, c))
            return
        algo_data, algo_filter = ctx.algo if isinstance(ctx.algo, tuple) else (ctx.algo, ctx.algo)
        if algo_filter == "implicit":
            self._backward_filter_implicit(ctx, x, dy, dw)
        else:
            col = self._im2col(ctx, x, pass_="backward_filter")
            np.matmul(dy2.T, col, out=dw.reshape(k, -1))
        if dx is None:
            return
        if algo_data == "implicit":
            self._backward_data_implicit(ctx, dy, w, dx)
        elif self._transposed_ok():
            self._backward_data_transposed(ctx, dy, w, dx)
        else:
            n, h, wd, _ = dx.shape
            shapes = self._workspace_shapes((n, c, h, wd), "backward_data", "im2col")
            dcol = _carve(ctx.workspace, dx.dtype, *shapes)[-1]
            np.matmul(dy2, w.reshape(k, -1), out=dcol)
            self._col2im(ctx, dcol, dx)

    # im2col ---------------------------------------------------------------------------------------
    def _im2col(self, ctx: Ctx, x: np.ndarray, pass_: str) -> np.ndarray:
        """Gather the receptive fields of ``x`` into the workspace's column matrix."""
        n, h, w, c = x.shape
        (kh, kw), (ph, pw) = self.kernel_size, self.padding
        ho, wo = (h + 2 * ph - kh) // self.stride[0] + 1, (w + 2 * pw - kw) // self.stride[1] + 1
        if ph or pw:
            xpad, col = _carve(ctx.workspace, x.dtype, (n, h + 2 * ph, w + 2 * pw, c), (n * ho * wo, kh * kw * c))
        else:
            xpad, (col,) = None, _carve(ctx.workspace, x.dtype, (n * ho * wo, kh * kw * c))
        _gather(x, xpad, col, self.kernel_size, self.stride, self.padding)
        return col

    def _transposed_ok(self) -> bool:
        """Backward-data as a forward convolution of dy with flipped filters: stride 1, padding < kernel."""
        return self.stride == (1, 1) and self.padding[0] < self.kernel_size[0] and self.padding[1] < self.kernel_size[1]

    def _backward_data_transposed(self, ctx: Ctx, dy: np.ndarray, w: np.ndarray, dx: np.ndarray) -> None:
        n, h, wd, c = dx.shape
        shapes = self._workspace_shapes((n, c, h, wd), "backward_data", "im2col")
        slots = _carve(ctx.workspace, dx.dtype, *shapes)
        dpad = slots[0] if len(slots) == 3 else None
        col, wflip = slots[-2], slots[-1]
        (kh, kw), (ph, pw) = self.kernel_size, self.padding
        k = self.out_channels
        wflip.reshape(kh, kw, k, c)[...] = w[:, ::-1, ::-1, :].transpose(1, 2, 0, 3)
        _gather(dy, dpad, col, self.kernel_size, (1, 1), (kh - 1 - ph, kw - 1 - pw))
        np.matmul(col, wflip, out=dx.reshape(-1, c))

    def _col2im(self, ctx: Ctx, dcol: np.ndarray, dx: np.ndarray) -> None:
        n, h, w, c = dx.shape
        (kh, kw), (sh, sw), (ph, pw) = self.kernel_size, self.stride, self.padding
        ho, wo = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
        d6 = dcol.reshape(n, ho, wo, kh, kw, c)
        if ph or pw:
            (dpad,) = _carve(ctx.workspace, dx.dtype, (n, h + 2 * ph, w + 2 * pw, c))  # the padded-input slot
        else:
            dpad = dx
        dpad.fill(0)
        for i in range(kh):
            for j in range(kw):
                dpad[:, i : i + sh * (ho - 1) + 1 : sh, j : j + sw * (wo - 1) + 1 : sw, :] += d6[:, :, :, i, j, :]
        if dpad is not dx:
            dx[...] = dpad[:, ph : ph + h, pw : pw + w, :]

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


_ONES: dict[tuple[int, Any], np.ndarray] = {}


def _ones(n: int, dtype: Any) -> np.ndarray:
    """A read-only vector of ones (the last few sizes are kept: they recur every step)."""
    key = (n, np.dtype(dtype))
    ones = _ONES.get(key)
    if ones is None:
        if len(_ONES) > 16:
            _ONES.clear()
        ones = _ONES[key] = np.ones(n, dtype=dtype)
        ones.flags.writeable = False
    return ones


def _gather(x: np.ndarray, xpad: np.ndarray | None, col: np.ndarray, kernel: tuple[int, int],
            stride: tuple[int, int], pad: tuple[int, int]) -> None:
    """im2col: copy every (kh, kw, C) window of ``x`` (zero-padded through ``xpad``) into a row of ``col``."""
    n, h, w, c = x.shape
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, pad
    ho, wo = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    if ph or pw:
        assert xpad is not None
        _zero_border(xpad, ph, pw)
        xpad[:, ph : ph + h, pw : pw + w, :] = x
        x = xpad
    s = x.strides
    windows = as_strided(x, (n, ho, wo, kh, kw, c), (s[0], s[1] * sh, s[2] * sw, s[1], s[2], s[3]), writeable=False)
    np.copyto(col.reshape(n, ho, wo, kh, kw, c), windows)


def _span(offset: int, pad: int, stride: int, size: int, out_size: int) -> tuple[int, int]:
    """Output indices o in [o0, o1) whose input index o*stride + offset - pad lies in [0, size)."""
    o0 = max(0, -(-(pad - offset) // stride))
    o1 = min(out_size, (size - 1 + pad - offset) // stride + 1)
    return o0, o1


def _zero_border(xpad: np.ndarray, ph: int, pw: int) -> None:
    if ph:
        xpad[:, :ph] = 0
        xpad[:, -ph:] = 0
    if pw:
        xpad[:, :, :pw] = 0
        xpad[:, :, -pw:] = 0
