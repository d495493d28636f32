"""Max and average pooling over channels-last tensors.

Output size follows Torch: floor((H + 2p - e) / s) + 1 for a window spanning e = d (k - 1) + 1 rows (d: the
dilation), or with ``ceil_mode=True`` the ceiling, where a
last window that would start beyond the input (right padding excluded) is dropped. Padding never
contributes to a maximum; for averages it counts in the divisor when ``count_include_pad`` (Torch's
default). Both are computed as one strided pass per window offset, so overlapping windows (3/2) work.
"""

from __future__ import annotations

from typing import Iterator, Sequence, TYPE_CHECKING

import numpy as np

from ..errors import ShapeError
from .base import AuxSpec, Ctx, Layer, Shape, physical
from .conv import _pair, span as _span

if TYPE_CHECKING:
    from .._typing import Array
    from numpy.typing import DTypeLike
    from .._typing import Xp

__all__ = ["MaxPool2d", "AvgPool2d", "Pad2d"]


def _out_size(size: int, k: int, s: int, p: int, ceil: bool) -> int:
    """Outputs along an axis for a window spanning ``k`` inputs (dilated: ``d * (k - 1) + 1``)."""
    span = size + 2 * p - k
    out = (-(-span // s) if ceil else span // s) + 1
    if ceil and (out - 1) * s >= size + p:
        out -= 1
    return out


class _Pool2d(Layer):
    def __init__(
        self,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] | None = None,
        padding: int | Sequence[int] = 0,
        ceil_mode: bool = False,
        dilation: int | Sequence[int] = 1,
    ):
        super().__init__()
        self.kernel_size = _pair(kernel_size, "kernel_size")
        self.stride = self.kernel_size if stride is None else _pair(stride, "stride")
        self.padding = _pair(padding, "padding")
        self.dilation = _pair(dilation, "dilation")
        self.ceil_mode = bool(ceil_mode)
        if min(self.kernel_size) < 1 or min(self.stride) < 1 or min(self.padding) < 0 or min(self.dilation) < 1:
            raise ValueError(
                f"{type(self).__name__}: bad geometry kernel={self.kernel_size} stride={self.stride} "
                f"padding={self.padding} dilation={self.dilation}"
            )
        if any(p * 2 > e for p, e in zip(self.padding, self.extent)):
            raise ValueError(f"{type(self).__name__}: padding {self.padding} must be at most half the window")

    @property
    def extent(self) -> tuple[int, int]:
        """The rows and columns a window spans: the kernel's, dilated."""
        return (
            self.dilation[0] * (self.kernel_size[0] - 1) + 1,
            self.dilation[1] * (self.kernel_size[1] - 1) + 1,
        )

    def extra_repr(self) -> str:
        return (
            f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"
            + (f", dilation={self.dilation}" if self.dilation != (1, 1) else "")
            + (", ceil_mode=True" if self.ceil_mode else "")
        )

    def output_shape(self, in_shapes: Sequence[Shape]) -> Shape:
        self.check_arity(in_shapes)
        shape = in_shapes[0]
        self.expect_rank(shape, 4)
        n, c, h, w = shape
        (kh, kw), (sh, sw), (ph, pw) = self.extent, self.stride, self.padding
        ho, wo = _out_size(h, kh, sh, ph, self.ceil_mode), _out_size(w, kw, sw, pw, self.ceil_mode)
        if ho < 1 or wo < 1 or h + 2 * ph < kh or w + 2 * pw < kw:
            raise ShapeError(f"layer {self.label}: a {kh}x{kw} window does not fit input of shape {tuple(shape)}")
        return (n, c, ho, wo)

    def flops(self, in_shapes: Sequence[Shape]) -> int:
        return int(np.prod(self.output_shape(in_shapes))) * self.kernel_size[0] * self.kernel_size[1]

    def _offsets(self, h: int, w: int, ho: int, wo: int) -> Iterator[tuple[int, slice, slice, slice, slice]]:
        """For each window offset: its index, the outputs it reaches, and the matching input slices."""
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = self.kernel_size, self.stride, self.padding, self.dilation
        for i in range(kh):
            o0, o1 = _span(i * dh, ph, sh, h, ho)
            for j in range(kw):
                p0, p1 = _span(j * dw, pw, sw, w, wo)
                if o0 >= o1 or p0 >= p1:
                    continue
                rows = slice(o0 * sh + i * dh - ph, (o1 - 1) * sh + i * dh - ph + 1, sh)
                cols = slice(p0 * sw + j * dw - pw, (p1 - 1) * sw + j * dw - pw + 1, sw)
                yield i * kw + j, slice(o0, o1), slice(p0, p1), rows, cols


def _pack_nibbles(xp: Xp, codes: Array, packed: Array) -> None:
    """Pack 4-bit ``codes`` (uint8, any shape) two to a byte, in memory order, low nibble first."""
    flat = codes.reshape(-1)
    xp.copyto(packed, flat[0::2])
    odd = flat[1::2]
    packed[: odd.size] |= odd << 4


def _unpack_nibbles(xp: Xp, packed: Array, codes: Array) -> None:
    flat = codes.reshape(-1)
    xp.bitwise_and(packed, 15, out=flat[0::2])
    xp.right_shift(packed[: flat.size // 2], 4, out=flat[1::2])


class MaxPool2d(_Pool2d):
    """Max pooling. Backward needs only the argmax map: the window position of each maximum, 4 bits per
    output (two to a byte, in the output's memory order) for windows of up to 16 positions, as Gist
    stores it; 1 byte per output for larger windows (at most 256 positions)."""

    kind = "maxpool"

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, dilation=1):
        super().__init__(kernel_size, stride, padding, ceil_mode, dilation)
        if self.kernel_size[0] * self.kernel_size[1] > 256:
            raise ValueError(f"MaxPool2d: a {self.kernel_size} window has more than 256 positions")

    @property
    def nibbles(self) -> bool:
        """Whether the argmax map is stored at 4 bits per output (windows of at most 16 positions)."""
        return self.kernel_size[0] * self.kernel_size[1] <= 16

    def aux_specs(self, in_shapes: Sequence[Shape]) -> dict[str, AuxSpec]:
        out = physical(self.output_shape(in_shapes))
        if self.nibbles:
            return {"argmax": AuxSpec((-(-int(np.prod(out)) // 2),), "uint8")}
        return {"argmax": AuxSpec(out, "uint8")}

    def _tiles(self, h: int, w: int, ho: int, wo: int) -> bool:
        """Windows tile the input exactly (stride = kernel, no padding, no remainder): no overlap, no gap."""
        (kh, kw), (sh, sw) = self.kernel_size, self.stride
        plain = self.padding == (0, 0) and self.dilation == (1, 1)
        return (kh, kw) == (sh, sw) and plain and (h, w) == (ho * kh, wo * kw)

    def _one_pass(self, x_shape: tuple[int, ...], y_shape: tuple[int, ...]) -> bool:
        """Whether the device's ops may pool in one pass (:meth:`~vmem.nn.ops.ArrayOps.maxpool_forward`): no
        padding or dilation, windows that do not overlap, every window inside the input."""
        (kh, kw), (sh, sw) = self.kernel_size, self.stride
        _, h, w, _ = x_shape
        _, ho, wo, _ = y_shape
        plain = self.padding == (0, 0) and self.dilation == (1, 1) and sh >= kh and sw >= kw
        return plain and (ho - 1) * sh + kh <= h and (wo - 1) * sw + kw <= w

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        xp, x, packed = ctx.xp, xs[0], ctx.aux["argmax"]
        if self._one_pass(x.shape, y.shape):
            if ctx.ops.maxpool_forward(x, y, packed, self.kernel_size, self.stride, self.nibbles):
                return

        def images(r: slice) -> None:
            if not self.nibbles:
                self._forward(xp, x[r], y[r], packed[r])
                return
            am = xp.empty(y[r].shape, dtype=np.uint8)
            self._forward(xp, x[r], y[r], am)
            _pack_nibbles(xp, am, packed[self._packed_rows(y, r)])

        ctx.ops.rows(y.shape[0], images, self._work(y, x.size))

    def _work(self, y: Array, size: int) -> int:
        """The work to cut between images: ``size``, or none where images share bytes of packed codes."""
        return size if not self.nibbles or (y.size // y.shape[0]) % 2 == 0 else 0

    @staticmethod
    def _packed_rows(y: Array, r: slice) -> slice:
        """The bytes of the packed argmax map that hold the codes of images ``r``."""
        per = y.size // y.shape[0]
        return slice(r.start * per // 2, -(-r.stop * per // 2))

    def _forward(self, xp: Xp, x: Array, y: Array, am: Array) -> None:
        _, h, w, _ = x.shape
        _, ho, wo, _ = y.shape
        if self.kernel_size == (2, 2) and self._tiles(h, w, ho, wo):
            self._forward_2x2(xp, x, y, am)
            return
        offsets = list(self._offsets(h, w, ho, wo))
        y.fill(-np.inf)
        for _, orow, ocol, irow, icol in offsets:
            yr = y[:, orow, ocol]
            xp.maximum(yr, x[:, irow, icol], out=yr)
        # argmax: the first window position holding the maximum (later positions are overwritten)
        am.fill(0)
        eq = xp.empty(y.shape, dtype=bool)
        for idx, orow, ocol, irow, icol in reversed(offsets):
            e = eq[:, orow, ocol]
            xp.equal(x[:, irow, icol], y[:, orow, ocol], out=e)
            xp.copyto(am[:, orow, ocol], idx, where=e)

    @staticmethod
    def _forward_2x2(xp: Xp, x: Array, y: Array, am: Array) -> None:
        """The common 2x2/2 case: a reduction for the maximum, pairwise comparisons for its position."""
        n, ho, wo, c = y.shape
        x6 = x.reshape(n, ho, 2, wo, 2, c)
        s0, s1, s2, s3 = (x6[:, :, i, :, j] for i in range(2) for j in range(2))
        xp.max(x6, axis=(2, 4), out=y)
        first = xp.greater(s1, s0)  # position within the first pair (ties: the first)
        second = xp.greater(s3, s2)
        in_second = xp.greater(y, xp.maximum(s0, s1))  # the maximum lies strictly in the second pair
        # argmax = first + in_second * (2 + second - first), in uint8
        xp.add(second, 2, out=am, casting="unsafe")
        am -= first
        am *= in_second
        am += first

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        dx = dxs[0]
        if dx is None:
            return
        xp, packed, relu = ctx.xp, ctx.aux["argmax"], ctx.relu_output
        if self._one_pass(dx.shape, dy.shape):
            if ctx.ops.maxpool_backward(dy, packed, dx, self.kernel_size, self.stride, self.nibbles, relu):
                return

        def images(r: slice) -> None:
            if self.nibbles:
                am = xp.empty(dy[r].shape, dtype=np.uint8)
                _unpack_nibbles(xp, packed[self._packed_rows(dy, r)], am)
            else:
                am = packed[r]
            self._backward(xp, dy[r], am, dx[r])

        ctx.ops.rows(dy.shape[0], images, self._work(dy, dx.size))
        if relu is not None:  # the ReLU before the pool: its backward, in place on the shared gradient
            ctx.ops.relu_backward(relu, dx, dx)

    def _backward(self, xp: Xp, dy: Array, am: Array, dx: Array) -> None:
        _, h, w, _ = dx.shape
        _, ho, wo, _ = dy.shape
        eq = xp.empty(dy.shape, dtype=bool)
        if self._tiles(h, w, ho, wo):  # every input position belongs to exactly one window: assign
            dx.fill(0)  # +0 where the value was not its window's maximum (whatever dy's sign), as the kernels
            for idx, orow, ocol, irow, icol in self._offsets(h, w, ho, wo):
                xp.equal(am, idx, out=eq)
                xp.copyto(dx[:, irow, icol], dy, where=eq)
            return
        dx.fill(0)
        for idx, orow, ocol, irow, icol in self._offsets(h, w, ho, wo):
            e = eq[:, orow, ocol]
            xp.equal(am[:, orow, ocol], idx, out=e)
            dx[:, irow, icol] += dy[:, orow, ocol] * e


class AvgPool2d(_Pool2d):
    """Average pooling. Backward needs nothing saved."""

    kind = "avgpool"

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True, dilation=1):
        super().__init__(kernel_size, stride, padding, ceil_mode, dilation)
        self.count_include_pad = bool(count_include_pad)

    def _divisor(self, xp: Xp, h: int, w: int, ho: int, wo: int, dtype: DTypeLike) -> Array:
        """Per-output divisor of shape (ho, wo, 1) (Torch's rule)."""
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = self.kernel_size, self.stride, self.padding, self.dilation

        def counts(size: int, k: int, s: int, p: int, d: int, out: int) -> Array:
            at = (xp.arange(out) * s - p)[:, None] + xp.arange(k) * d  # each window's positions
            lo, hi = (-p, size + p) if self.count_include_pad else (0, size)
            return ((at >= lo) & (at < hi)).sum(axis=1).astype(np.float64)

        # made where the arrays live (no host array uploaded a step)
        div = xp.outer(counts(h, kh, sh, ph, dh, ho), counts(w, kw, sw, pw, dw, wo))[:, :, None]
        return div.astype(dtype)

    def _uniform(self, h: int, w: int, ho: int, wo: int) -> float | None:
        """The divisor where every window counts alike (no padding counted apart, no window past the edge: a
        global average pooling), else None; counted on the host (no array made or uploaded)."""
        divisor = self._divisor(np, h, w, ho, wo, np.float64)
        first = float(divisor.flat[0])
        return first if bool((divisor == first).all()) else None

    def _disjoint(self, ho: int, wo: int) -> bool:
        """Whether no input position lies in two windows (each gradient value lands in one place)."""
        (kh, kw), (sh, sw), _, (dh, dw) = self.kernel_size, self.stride, self.padding, self.dilation
        return (ho == 1 or (kh - 1) * dh < sh) and (wo == 1 or (kw - 1) * dw < sw)

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        xp, x = ctx.xp, xs[0]
        _, h, w, _ = x.shape
        _, ho, wo, _ = y.shape
        y.fill(0)
        for _, orow, ocol, irow, icol in self._offsets(h, w, ho, wo):
            y[:, orow, ocol] += x[:, irow, icol]
        uniform = self._uniform(h, w, ho, wo)
        y /= self._divisor(xp, h, w, ho, wo, y.dtype) if uniform is None else uniform

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        dx = dxs[0]
        if dx is None:
            return
        xp = ctx.xp
        _, h, w, _ = dx.shape
        _, ho, wo, _ = dy.shape
        uniform = self._uniform(h, w, ho, wo)
        dx.fill(0)
        if uniform is not None and self._disjoint(ho, wo):  # each value divided where it lands: no temporary
            for _, orow, ocol, irow, icol in self._offsets(h, w, ho, wo):
                dx[:, irow, icol] += dy[:, orow, ocol]
            dx /= uniform
            return
        g = dy / self._divisor(xp, h, w, ho, wo, dy.dtype)
        for _, orow, ocol, irow, icol in self._offsets(h, w, ho, wo):
            dx[:, irow, icol] += g[:, orow, ocol]


class Pad2d(Layer):
    """``Pad2d(pads, value=0.0)``: a map padded by ``pads`` = (top, left, bottom, right) rows and columns of
    ``value`` (-inf before a max pooling; any side may differ: TensorFlow's SAME padding). Backward needs
    nothing: the gradient is the inner part of the output's."""

    kind = "pad"

    def __init__(self, pads: Sequence[int], value: float = 0.0):
        super().__init__()
        self.pads = tuple(int(p) for p in pads)
        if len(self.pads) != 4 or min(self.pads) < 0:
            raise ValueError(f"Pad2d: pads={pads!r} must be four non-negative ints (top, left, bottom, right)")
        self.value = float(value)

    def extra_repr(self) -> str:
        return f"{self.pads}" + (f", value={self.value:g}" if self.value else "")

    def output_shape(self, in_shapes: Sequence[Shape]) -> Shape:
        self.check_arity(in_shapes)
        shape = in_shapes[0]
        self.expect_rank(shape, 4)
        n, c, h, w = shape
        t, left, bottom, r = self.pads
        return (n, c, h + t + bottom, w + left + r)

    def flops(self, in_shapes: Sequence[Shape]) -> int:
        return 0

    def _inner(self, shape: Sequence[int]) -> tuple:
        t, left, bottom, r = self.pads
        return (slice(None), slice(t, shape[1] - bottom), slice(left, shape[2] - r), slice(None))

    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        y.fill(self.value)
        y[self._inner(y.shape)] = xs[0]

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        if dxs[0] is not None:
            dxs[0][...] = dy[self._inner(dy.shape)]
