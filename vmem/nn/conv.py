"""2-D convolution: the layer (shapes, parameters, FLOPs). Its passes run on the device's convolution
backend (``ctx.conv``, a :class:`~vmem.device.base.ConvBackend`): the host's im2col, implicit GEMM and
Winograd algorithms on the CPU device, cuDNN's on a GPU; the pass's algorithm is ``ctx.algo``, a name from
the program's catalog (what the planner chose).
"""

from __future__ import annotations

from typing import Any, Sequence, TYPE_CHECKING

from ..errors import ShapeError
from .base import Ctx, Layer, ParamSpec, Shape, check_init

if TYPE_CHECKING:
    from .._typing import Array

__all__ = ["Conv2d"]


def _pair(v: int | Sequence[int], name: str) -> tuple[int, int]:
    if isinstance(v, int):
        return (v, v)
    v = tuple(v)
    if len(v) != 2 or not all(isinstance(i, int) for i in v):
        raise ValueError(f"{name}={v!r}: expected an int or a pair of ints")
    return v  # type: ignore[return-value]


def span(offset: int, pad: int, stride: int, size: int, out_size: int) -> tuple[int, int]:
    """Output indices o in [o0, o1) whose input index ``o * stride + offset - pad`` lies in [0, size): the
    outputs a window offset touches (convolutions' and poolings' geometry)."""
    o0 = max(0, -(-(pad - offset) // stride))
    o1 = min(out_size, (size - 1 + pad - offset) // stride + 1)
    return o0, o1


class Conv2d(Layer):
    """2-D convolution ``Conv2d(in_channels, out_channels, kernel_size, stride=1, padding=0, bias=True,
    groups=1, dilation=1)``.

    Input (N, C, H, W), output (N, K, Ho, Wo) with Ho = (H + 2p - e) // s + 1, where the kernel spans
    e = d (kh - 1) + 1 rows (``dilation`` d: the filter's taps d apart, as DeepLab's atrous convolutions).
    Backward needs the input. Parameters: ``weight`` (K, kh, kw, C / groups) and ``bias`` (K,). With
    ``groups`` g, the channels are split into g groups, each output group convolving its input group only
    (g = C: a depthwise convolution, as MobileNet's).
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
        groups: int = 1,
        dilation: int | Sequence[int] = 1,
        init: str = "he",
    ):
        super().__init__()
        self.init = check_init("Conv2d", init)
        for name, v in (("in_channels", in_channels), ("out_channels", out_channels), ("groups", groups)):
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"Conv2d: {name}={v!r} must be a positive int")
        if in_channels % groups or out_channels % groups:
            raise ValueError(
                f"Conv2d: groups={groups} must divide in_channels={in_channels} and out_channels={out_channels}"
            )
        self.groups = groups
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = _pair(kernel_size, "kernel_size")
        self.stride = _pair(stride, "stride")
        self.padding = _pair(padding, "padding")
        self.dilation = _pair(dilation, "dilation")
        if min(self.kernel_size) < 1 or min(self.stride) < 1 or min(self.padding) < 0 or min(self.dilation) < 1:
            raise ValueError(
                f"Conv2d: bad geometry kernel={self.kernel_size} stride={self.stride} padding={self.padding} "
                f"dilation={self.dilation}"
            )
        self.bias = bias

    @property
    def extent(self) -> tuple[int, int]:
        """The rows and columns the kernel spans: its size, dilated."""
        (kh, kw), (dh, dw) = self.kernel_size, self.dilation
        return dh * (kh - 1) + 1, dw * (kw - 1) + 1

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, padding={self.padding}"
            + ("" if self.bias else ", bias=False")
            + (f", groups={self.groups}" if self.groups > 1 else "")
            + (f", dilation={self.dilation}" if self.dilation != (1, 1) else "")
            + (f", init={self.init!r}" if self.init != "he" else "")
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
        (kh, kw), (sh, sw), (ph, pw) = self.extent, self.stride, self.padding
        ho, wo = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
        if ho < 1 or wo < 1:
            raise ShapeError(
                f"layer {self.label}: a {kh}x{kw} kernel with padding {self.padding} does not fit input "
                f"of shape {tuple(shape)}"
            )
        return (n, self.out_channels, ho, wo)

    def param_specs(self, in_shapes: Sequence[Shape]) -> dict[str, ParamSpec]:
        kh, kw = self.kernel_size
        per_group = self.in_channels // self.groups
        fan_in = per_group * kh * kw
        fan_out = self.out_channels // self.groups * kh * kw
        specs = {"weight": ParamSpec((self.out_channels, kh, kw, per_group), self.init, fan_in, fan_out)}
        if self.bias:
            specs["bias"] = ParamSpec((self.out_channels,), "zeros")
        return specs

    def flops(self, in_shapes: Sequence[Shape]) -> int:
        n, k, ho, wo = self.output_shape(in_shapes)
        kh, kw = self.kernel_size
        return 2 * n * k * ho * wo * (self.in_channels // self.groups) * kh * kw

    # -- math (the device's convolutions) --------------------------------------------------------
    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        self._backend(ctx).forward(self, ctx, xs[0], ctx.params["weight"], y, ctx.params["bias"] if self.bias else None)

    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        """``ctx.algo`` is one algorithm for both passes or a pair (backward_data, backward_filter); the
        bias's gradient, then the filters', then the input's (where wanted), in one workspace. Without
        gradients in ``ctx.grads`` only the input's (the second half of a split backward: ``xs`` may then
        be None); with ``dxs[0]`` None, only the weights'."""
        x = xs[0] if xs is not None else None
        dw = ctx.grads.get("weight")
        db = ctx.grads.get("bias") if self.bias else None
        self._backend(ctx).backward(self, ctx, dy, x, ctx.params["weight"], dxs[0], dw, db)

    def _backend(self, ctx: Ctx) -> Any:
        if ctx.conv is None:
            raise ValueError(
                f"layer {self.label}: no convolution backend in ctx.conv (the device's conv_backend runs "
                "a convolution's passes)"
            )
        return ctx.conv
