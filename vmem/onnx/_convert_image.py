"""The ONNX importer's converters for image layers: convolution, batch norm, pooling, padding, the element-wise
activations and a mean over the spatial axes (each registered with the op versions it was written for)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .. import nn
from ..errors import ShapeError

from . import _views
from ._builder import (
    Attrs,
    Ins,
    Outs,
    _Refuse,
    _Tensor,
    _Unusable,
    _converts,
    _Builder,
    _real,
    _ints,
    _as_image,
    _as_tensor,
    _reshaped,
    _no_batch_axis,
)


# -- windows ---------------------------------------------------------------------------------------
def _window(
    b: _Builder, x: _Tensor, kernel: list[int], attrs: dict[str, Any]
) -> tuple[list[int], list[int], list[int]]:
    """(strides, dilations, pads (begins, then ends)) of a convolution or pooling window over the model's
    spatial axes of ``x``."""
    n = len(kernel)
    if n != len(x.dims) - 2 or not 1 <= n <= 3:
        raise _Refuse(f"a {n}-D window over a tensor of shape {x.dims}")
    strides = _ints(attrs, "strides", [1] * n)
    dilations = _ints(attrs, "dilations", [1] * n)
    auto = attrs.get("auto_pad", "NOTSET")
    if auto in ("NOTSET", "VALID"):
        pads = _ints(attrs, "pads", [0] * 2 * n) if auto == "NOTSET" else [0] * 2 * n
    else:  # SAME_UPPER / SAME_LOWER: the output is ceil(size / stride)
        pads = [0] * 2 * n
        for axis in range(n):
            size = x.dims[2 + axis]
            out = -(-size // strides[axis])
            total = max(0, (out - 1) * strides[axis] + dilations[axis] * (kernel[axis] - 1) + 1 - size)
            small, large = total // 2, total - total // 2
            pads[axis], pads[axis + n] = (small, large) if auto == "SAME_UPPER" else (large, small)
    return strides, dilations, pads


def _padded(
    b: _Builder, x: _Tensor, extent: Sequence[int], pads: list[int], value: float, pool: bool
) -> tuple[_Tensor, list[int]]:
    """(input, symmetric pads) of a 2-D window spanning ``extent``: padding vmem's layers cannot take
    (asymmetric: TensorFlow's SAME; wider than half a pooling window) is done first by a Pad2d of ``value``
    (0 for a convolution or an average, -inf for a maximum), the layer then padding nothing."""
    wide = pool and (pads[0] * 2 > extent[0] or pads[1] * 2 > extent[1])
    if pads[0] == pads[2] and pads[1] == pads[3] and not wide:
        return x, pads[:2]
    return b.add(nn.Pad2d((pads[0], pads[1], pads[2], pads[3]), value), [x]), [0, 0]


def _pool2d(
    b: _Builder,
    x: _Tensor,
    kernel: list[int],
    strides: list[int],
    dilations: list[int],
    pads: list[int],
    attrs: dict[str, Any],
    average: bool,
) -> _Tensor:
    """A 2-D pooling of the image ``x``, pads (top, left, bottom, right). An average over padding it does not
    count (``count_include_pad=0``) that vmem's AvgPool2d cannot take (asymmetric or wide) is the counted
    average over the padded map, times the constant ratio of the two divisors."""
    ceil = bool(attrs.get("ceil_mode", 0))
    counted = bool(attrs.get("count_include_pad", 0))
    extent = [d * (k - 1) + 1 for k, d in zip(kernel, dilations)]
    padded, sym = _padded(b, x, extent, pads, 0.0 if average else -np.inf, pool=True)
    if not average:
        layer: nn.Layer = nn.MaxPool2d(tuple(kernel), tuple(strides), tuple(sym), ceil, tuple(dilations))
        return b.add(layer, [padded])
    uncounted = padded is not x and not counted
    layer = nn.AvgPool2d(tuple(kernel), tuple(strides), tuple(sym), ceil, counted or uncounted, tuple(dilations))
    y = b.add(layer, [padded])
    if not uncounted:
        return y
    ratio = np.ones(y.shape[2:])
    for axis in range(2):
        size, out = x.shape[2 + axis], y.shape[2 + axis]
        at = (np.arange(out) * strides[axis] - pads[axis])[:, None] + np.arange(kernel[axis]) * dilations[axis]
        inside_pads = ((at >= -pads[axis]) & (at < size + pads[axis + 2])).sum(axis=1)
        inside = ((at >= 0) & (at < size)).sum(axis=1)
        ratio = ratio * (inside_pads / np.maximum(inside, 1)).reshape((-1, 1) if axis == 0 else (1, -1))
    return b.add(nn.ConstantOp("mul", ratio[None]), [y])


def _pool(average: bool) -> Callable[..., list[Any]]:
    """MaxPool / AveragePool over 1, 2 or 3 spatial axes: a 1-D pooling is a 2-D one over maps of height 1; a
    3-D one is two 2-D ones (over (H, W), then over D), exact because both operations separate by axis (a
    maximum of maxima; sums of sums over counts that multiply)."""

    def convert(b: _Builder, ins: Ins, attrs: Attrs) -> Outs:
        x = b.tensor(ins, 0, "input")
        if x.lead:
            _as_image(b, x, "input")  # refuses, saying why
        kernel = _ints(attrs, "kernel_shape", [])
        strides, dilations, pads = _window(b, x, kernel, attrs)
        if int(attrs.get("storage_order", 0)):
            raise _Refuse("storage_order=1 (column-major indices) is not supported")
        n, (batch, c, *spatial) = len(kernel), x.dims
        indices = _Unusable("max pooling's indices")
        if n == 2:
            return [_pool2d(b, _as_image(b, x, "input"), kernel, strides, dilations, pads, attrs, average), indices]
        if n == 1:
            (length,) = spatial
            img = _reshaped(b, x, (batch, c, 1, length))
            y = _pool2d(
                b,
                _as_image(b, img, "input"),
                [1] + kernel,
                [1] + strides,
                [1] + dilations,
                [0, pads[0], 0, pads[1]],
                attrs,
                average,
            )
            return [_reshaped(b, y, (batch, c, y.dims[3])), indices]
        d, h, w = spatial
        planes = _as_image(b, _reshaped(b, x, (batch, c * d, h, w)), "input")
        y = _pool2d(
            b, planes, kernel[1:], strides[1:], dilations[1:], [pads[1], pads[2], pads[4], pads[5]], attrs, average
        )
        ho, wo = y.dims[2:]
        rows = _as_image(b, _reshaped(b, y, (batch, c, d, ho * wo)), "input")
        z = _pool2d(
            b, rows, [kernel[0], 1], [strides[0], 1], [dilations[0], 1], [pads[0], 0, pads[3], 0], attrs, average
        )
        return [_reshaped(b, z, (batch, c, z.dims[2], ho, wo)), indices]

    return convert


_converts("MaxPool", 8, 10, 11, 12, 22)(_pool(False))
_converts("AveragePool", 7, 10, 11, 19, 22)(_pool(True))


def _global(average: bool) -> Callable[..., list[Any]]:
    def convert(b: _Builder, ins: Ins, attrs: Attrs) -> Outs:
        x = _as_image(b, b.tensor(ins, 0, "input"), "input")
        window = (x.shape[2], x.shape[3])
        return [b.add(nn.AvgPool2d(window) if average else nn.MaxPool2d(window), [x])]

    return convert


_converts("GlobalAveragePool", 1, 22)(_global(True))
_converts("GlobalMaxPool", 1, 22)(_global(False))


@_converts("Conv", 1, 11, 22)
def _conv(b: _Builder, ins: Ins, attrs: Attrs) -> Outs:
    x = _as_image(b, b.tensor(ins, 0, "input"), "input")
    w = b.weight(ins, 1, "weights", "weight")
    bias = b.weight(ins, 2, "bias", "bias", optional=True)
    assert w is not None
    if w.ndim != 4:
        raise _Refuse(f"weights of shape {w.shape}: vmem has 2-D convolutions only")
    group = int(attrs.get("group", 1))
    k, cg, kh, kw = w.shape
    c = cg * group
    if c != x.shape[1] or k % group:
        raise _Refuse(f"weights {w.shape} in {group} group(s) do not match an input of {x.shape[1]} channels")
    strides, dilations, pads = _window(b, x, _ints(attrs, "kernel_shape", [kh, kw]), attrs)
    extent = [d * (size - 1) + 1 for d, size in zip(dilations, (kh, kw))]
    x, sym = _padded(b, x, extent, pads, 0.0, pool=False)
    layer = nn.Conv2d(
        c, k, (kh, kw), stride=tuple(strides), padding=tuple(sym), bias=bias is not None, groups=group,
        dilation=tuple(dilations),
    )  # fmt: skip
    return [b.add(layer, [x], {"weight": w.transpose(0, 2, 3, 1), "bias": bias})]


@_converts("BatchNormalization", 9, 14, 15)
def _batchnorm(b: _Builder, ins: Ins, attrs: Attrs) -> Outs:
    x = _as_image(b, b.tensor(ins, 0, "input"), "input")
    scale, shift = b.weight(ins, 1, "scale", "weight"), b.weight(ins, 2, "bias", "bias")
    mean = b.weight(ins, 3, "running mean", "running_mean")
    var = b.weight(ins, 4, "running variance", "running_var")
    momentum = _real(attrs.get("momentum", 0.9))  # ONNX's: the weight of the old running value
    layer = nn.BatchNorm2d(x.shape[1], eps=_real(attrs.get("epsilon", 1e-5)), momentum=round(1.0 - momentum, 12))
    y = b.add(layer, [x], {"weight": scale, "bias": shift, "running_mean": mean, "running_var": var})
    stats = _Unusable("batch norm's running statistics as outputs (training-mode export): vmem keeps them itself")
    return [y, stats, stats]


@_converts("LRN", 1, 13)
def _lrn(b: _Builder, ins: Ins, attrs: Attrs) -> Outs:
    x = _as_image(b, b.tensor(ins, 0, "input"), "input")
    if "size" not in attrs:
        raise _Refuse("has no size (a required attribute)")
    layer = nn.LocalResponseNorm(
        int(attrs["size"]),
        alpha=_real(attrs.get("alpha", 1e-4)),
        beta=_real(attrs.get("beta", 0.75)),
        k=_real(attrs.get("bias", 1.0)),
    )
    return [b.add(layer, [x])]


def _elementwise(make: Callable[[], nn.Layer]) -> Callable[..., list[Any]]:
    def convert(b: _Builder, ins: Ins, attrs: Attrs) -> Outs:
        x = b.tensor(ins, 0, "input", chw=True, view=True)
        return [b.add(make(), [x], chw=x.chw, lifted=x.lifted)]

    return convert


_converts("Relu", 6, 13, 14)(_elementwise(nn.ReLU))
_converts("Sigmoid", 6, 13)(_elementwise(nn.Sigmoid))
_converts("Tanh", 6, 13)(_elementwise(nn.Tanh))
_converts("Erf", 9, 13)(_elementwise(nn.Erf))
_converts("HardSwish", 14, 22)(_elementwise(nn.HardSwish))


@_converts("Pow", 7, 12, 13, 15)
def _pow(b: _Builder, ins: Ins, attrs: Attrs) -> Outs:
    """A computed tensor to a constant power (one value, or an array without the batch axis):
    :class:`vmem.nn.Power`."""
    if not isinstance(ins[0], _Tensor):
        raise _Refuse("raises a constant to a computed power (vmem's Power takes a constant exponent)")
    exponent = b.const(ins, 1, "exponent")
    assert exponent is not None
    if exponent.dtype.kind not in "fiu":
        raise _Refuse(f"an exponent of type {exponent.dtype}")
    try:
        if exponent.size == 1:  # element by element, whatever the layout
            x = b.tensor(ins, 0, "input", chw=True, view=True)
            return [b.add(nn.Power(exponent.reshape(())), [x], chw=x.chw, lifted=x.lifted)]
        x = b.tensor(ins, 0, "input")
        return [b.add(nn.Power(exponent), [x], lifted=x.lifted)]
    except (ValueError, ShapeError) as exc:
        raise _Refuse(str(exc)) from None


@_converts("HardSigmoid", 6, 22)
def _hardsigmoid(b: _Builder, ins: Ins, attrs: Attrs) -> Outs:
    x = b.tensor(ins, 0, "input", chw=True, view=True)
    layer = nn.HardSigmoid(_real(attrs.get("alpha", 0.2)), _real(attrs.get("beta", 0.5)))  # ONNX's defaults
    return [b.add(layer, [x], chw=x.chw, lifted=x.lifted)]


@_converts("Gelu", 20)
def _gelu(b: _Builder, ins: Ins, attrs: Attrs) -> Outs:
    approximate = attrs.get("approximate", "none")
    if approximate not in nn.GELU.APPROXIMATIONS:
        raise _Refuse(f"approximate={approximate!r} (vmem's GELU takes {', '.join(nn.GELU.APPROXIMATIONS)})")
    x = b.tensor(ins, 0, "input", chw=True, view=True)
    return [b.add(nn.GELU(approximate), [x], chw=x.chw, lifted=x.lifted)]


@_converts("Clip", 6, 11, 12, 13)
def _clip(b: _Builder, ins: Ins, attrs: Attrs) -> Outs:
    x = b.tensor(ins, 0, "input", chw=True, view=True)
    if b.opset < 11:
        lo, hi = _real(attrs.get("min", -np.inf)), _real(attrs.get("max", np.inf))
    else:
        lo_c, hi_c = b.const(ins, 1, "min", optional=True), b.const(ins, 2, "max", optional=True)
        lo = -np.inf if lo_c is None else _real(lo_c)
        hi = np.inf if hi_c is None else _real(hi_c)
    if lo == -np.inf and hi == np.inf:
        return [x]
    lo = min(lo, hi)  # ONNX: where min > max, every value becomes max
    layer: nn.Layer = nn.ReLU() if lo == 0 and hi == np.inf else nn.Clip(lo, hi)
    return [b.add(layer, [x], chw=x.chw, lifted=x.lifted)]


@_converts("Pad", 2, 11, 13, 18, 19, 21, 23, 24, 25)
def _pad(b: _Builder, ins: Ins, attrs: Attrs) -> Outs:
    """Constant padding of a map's height and width (TensorFlow's exports pad before a convolution)."""
    x = _as_image(b, b.tensor(ins, 0, "data"), "data")
    if attrs.get("mode", "constant") != "constant":
        raise _Refuse(f"mode={attrs.get('mode')!r}: vmem pads with a constant")
    if b.opset < 11:
        pads, value = _ints(attrs, "pads", []), _real(attrs.get("value", 0.0))
    else:
        pads = [int(p) for p in b.const(ins, 1, "pads").reshape(-1)]  # type: ignore[union-attr]
        given = b.const(ins, 2, "constant_value", optional=True)
        value = 0.0 if given is None or given.size == 0 else _real(given.reshape(-1)[0])
        axes = b.const(ins, 3, "axes", optional=True)
        if axes is not None:  # pads for the axes named: the others nothing
            full = [0] * 8
            for k, a in enumerate(int(a) % 4 for a in axes.reshape(-1)):
                full[a], full[a + 4] = pads[k], pads[k + len(axes.reshape(-1))]
            pads = full
    if len(pads) != 8 or any(pads[a] or pads[a + 4] for a in (0, 1)) or min(pads) < 0:
        raise _Refuse(f"pads={pads}: vmem pads a map's height and width, by zero or more")
    return [b.add(nn.Pad2d((pads[2], pads[3], pads[6], pads[7]), value), [x])]


@_converts("ReduceSum", 1, 11, 13)
def _reduce_sum(b: _Builder, ins: Ins, attrs: Attrs) -> Outs:
    """The sum over axes: their mean (:func:`_reduce_mean`) times how many values each sums."""
    x = b.tensor(ins, 0, "input", view=True)
    axes = _reduced_axes(b, ins, attrs, len(x.dims), b.opset >= 13)
    if axes is None:
        return [x]
    count = float(np.prod([x.dims[a] for a in axes]))
    means = _reduce_mean(b, [x, *ins[1:]], attrs, axes_input=b.opset >= 13)
    if count == 1:
        return means
    y = b.tensor(means, 0, "mean", view=True)
    return [b.add(nn.ConstantOp("mul", count), [y], lifted=y.lifted)]


def _reduced_axes(b: _Builder, ins: list[Any], attrs: dict[str, Any], rank: int, axes_input: bool) -> list[int] | None:
    """The axes a reduction reduces, sorted (every axis where none are named); None where it is a no-op."""
    if axes_input:
        given = b.const(ins, 1, "axes", optional=True)
        if (given is None or given.size == 0) and int(attrs.get("noop_with_empty_axes", 0)):
            return None
        axes = list(range(rank)) if given is None or given.size == 0 else [int(a) for a in given.reshape(-1)]
    else:
        axes = _ints(attrs, "axes", range(rank))
    return sorted({a % rank for a in axes})


@_converts("ReduceMean", 1, 11, 13, 18)
def _reduce_mean(b: _Builder, ins: Ins, attrs: Attrs, axes_input: bool | None = None) -> Outs:
    """The mean over axes: over a map's height and width (what exporters write for adaptive average pooling
    to 1x1) a global average pool; over others a Mean. Reduced axes kept, then dropped by a reshape where
    ``keepdims=0``."""
    x = b.tensor(ins, 0, "input", view=True)
    rank = len(x.dims)
    found = _reduced_axes(b, ins, attrs, rank, b.opset >= 18 if axes_input is None else axes_input)
    if found is None:
        return [x]
    axes = found
    if x.view is not None:  # along axes of a tensor whose batch axis moved: each one vmem axis
        raw, groups = _views.groups_of(b, x)
        y = _views.run(b, nn.Mean([_views.single(raw, groups, a, "averages over") for a in axes]), [raw], groups)
        if int(attrs.get("keepdims", 1)):
            return [y]
        kept = tuple(g for a, g in enumerate(groups) if a not in axes)
        return [_views.viewed(_Tensor(y.node, y.shape), kept)]
    _no_batch_axis(b, axes, "averages over")
    if x.image and axes == [2, 3]:
        y = b.add(nn.AvgPool2d((x.shape[2], x.shape[3])), [x])
    else:
        x = _as_tensor(b, x)
        y = b.add(nn.Mean([x.axis(a) for a in axes]), [x], lifted=x.lifted)
    if int(attrs.get("keepdims", 1)):
        return [y]
    return [_reshaped(b, y, [d for a, d in enumerate(y.dims) if a not in axes])]
