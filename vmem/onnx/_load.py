"""The ONNX importer: an ONNX model -> a trainable :class:`vmem.Graph` with the model's weights (see
:mod:`vmem.onnx`)."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from .. import nn
from ..errors import CheckpointError, OnnxError, ShapeError
from ..graph import Graph
from ..graph.network import Node
from . import _data

__all__ = ["load", "supported", "MIN_OPSET"]

#: The oldest opset a model may declare (older ones carry attributes long removed, e.g. ``consumed_inputs``).
MIN_OPSET = 9
#: The batch axis's stand-in while shapes are computed at import (``Shape`` of a feature map): a prime that
#: no real dimension is, so that a reshape target keeping the batch axis is recognised as such.
BATCH = 1_000_003
#: Ops whose output holds its (first) input's values, rearranged: a weight made so keeps its initializer's
#: name. (Not Identity: an exporter that merges equal initializers names each copy after its own parameter,
#: ``bn1.running_mean = Identity(bn1.bias)`` while both are zeros.)
_SAME_VALUES = ("Transpose", "Cast", "Reshape", "Squeeze", "Unsqueeze", "Flatten")
#: The most values a constant computed at import may hold (a shape computation, never a feature map).
_MOST_FOLDED = 1 << 22


def _onnx() -> Any:
    try:
        import onnx
    except ImportError:
        raise ImportError("vmem.onnx needs the onnx package: pip install 'vmem[onnx]'") from None
    return onnx


class _Refuse(Exception):
    """This node cannot be imported; the message says why."""


@dataclass
class _Tensor:
    """A value the network computes: its node in the vmem graph and its shape in vmem at batch 1.

    vmem's axes may hold axes of length 1 the model does not see (``hidden``): vmem's batch axis where the
    model has none (``lead``: imported with ``batch=False``), and an axis after the batch axis where a
    tensor of vmem rank 4 is not an image (``lifted``). :attr:`dims` is the shape the model sees."""

    node: Node
    shape: tuple[int, ...]
    #: a 4-D map flattened in vmem's stored order (H, W, C) where ONNX's Flatten orders it (C, H, W): the
    #: (C, H, W) that a weight reading it is permuted from; element-wise ops carry it, others refuse it
    chw: tuple[int, int, int] | None = None
    #: a 4-D map transposed to (N, H, W, C) (what :func:`vmem.onnx.save` writes before a Flatten), not yet
    #: made: a flatten reads it as vmem's own (H, W, C) order, anything else as an nn.Transpose made then
    nhwc: bool = False
    #: a tensor of vmem rank 4 that is not an image (attention's (N, heads, T, d), a mask (N, 1, 1, T)): vmem
    #: holds it with an axis of length 1 after the batch axis, as a 5-D tensor (it stores 4-D ones as images)
    lifted: bool = False
    #: the model has no batch axis (``load(batch=False)``): vmem's axis 0 is its own, of length 1 here
    lead: bool = False

    @property
    def hidden(self) -> tuple[int, ...]:
        """vmem's axes the model does not see."""
        return tuple(i for i, on in ((0, self.lead), (1, self.lifted)) if on)

    @property
    def dims(self) -> tuple[int, ...]:
        """The shape as the model sees it (at batch 1 where the model has a batch axis)."""
        hidden = self.hidden
        return tuple(d for i, d in enumerate(self.shape) if i not in hidden)

    @property
    def image(self) -> bool:
        """A 4-D map as vmem stores images (the model's (N, C, H, W))."""
        return len(self.shape) == 4 and not self.lifted and not self.lead

    def axis(self, a: int) -> int:
        """vmem's axis for the model's axis ``a`` of this tensor."""
        hidden = self.hidden
        return [i for i in range(len(self.shape)) if i not in hidden][a % len(self.dims)]


@dataclass
class _Unusable:
    """An output no vmem layer gives (batch norm's running statistics, max pooling's indices)."""

    reason: str


#: what a refused node's outputs hold (the nodes reading them are not named again)
_REFUSED = _Unusable("a refused node's output")


@dataclass(frozen=True)
class _Converter:
    op: str
    versions: tuple[int, ...]  # the op versions (since_version) it was written for
    fn: Callable[..., list[Any]]


_CONVERTERS: dict[str, _Converter] = {}


def _converts(op: str, *versions: int) -> Callable[[Callable[..., list[Any]]], Callable[..., list[Any]]]:
    def register(fn: Callable[..., list[Any]]) -> Callable[..., list[Any]]:
        _CONVERTERS[op] = _Converter(op, versions, fn)
        return fn

    return register


def supported() -> dict[str, tuple[int, ...]]:
    """The ops that become layers, each with the op versions (``since_version``) its converter handles. Any
    other op is imported where all its inputs are constants (a shape computation), evaluated at import."""
    return {op: c.versions for op, c in sorted(_CONVERTERS.items())}


class _Builder:
    """The vmem graph under construction and the weights it takes from the model."""

    def __init__(self, graph: Graph, opset: int):
        self.graph = graph
        self.opset = opset
        self.params: dict[str, np.ndarray] = {}
        self.owner: dict[str, str] = {}  # initializer name -> the layer whose parameter it became
        self.node: Any = None  # the ONNX node being converted
        self.input_names: list[str] = []
        self._taken: list[tuple[str, str]] = []  # (parameter, initializer) the node's layer takes
        self.sources: dict[str, str] = {}  # "layer.param" -> the initializer it was made from
        self.static_batch = 0  # the batch size the model's input declares, where it declares one
        self.lead = False  # the model has no batch axis (load(batch=False))
        self.readers: dict[str, int] = {}  # how many nodes read each value of the model (the output counts)
        self.reader_ops: dict[str, set[str]] = {}  # the ops reading each value ("" for the model's output)
        #: a constant computed from one initializer by a transpose, reshape or cast -> that initializer
        self.origin: dict[str, str] = {}
        self.untied: list[str] = []  # initializers more than one layer took as a parameter

    def start(self, node: Any) -> None:
        """Convert ``node`` next."""
        self.node, self.input_names, self._taken = node, list(node.input), []

    # -- inputs of the node being converted --------------------------------------------------------
    def tensor(self, ins: list[Any], i: int, what: str, *, nhwc: bool = False, chw: bool = False) -> _Tensor:
        value = ins[i] if i < len(ins) else None
        if not isinstance(value, _Tensor):
            raise _Refuse(f"its {what} (input {i}) must be computed by the network, not a constant")
        if value.nhwc and not nhwc:  # read as the transposed tensor it is: made now
            value = self.add(nn.Transpose((0, 2, 3, 1)), [_Tensor(value.node, value.shape)])
        if value.chw is not None and not chw:
            raise _Refuse(
                f"its {what} is a map flattened in (C, H, W) order, which vmem stores as (H, W, C): only "
                "element-wise ops and Gemm/MatMul with constant weights may read it"
            )
        return value

    def const(self, ins: list[Any], i: int, what: str, *, optional: bool = False) -> np.ndarray | None:
        value = ins[i] if i < len(ins) else None
        if value is None and optional:
            return None
        if not isinstance(value, np.ndarray):
            raise _Refuse(f"its {what} (input {i}) must be a constant (an initializer)")
        return value

    def weight(self, ins: list[Any], i: int, what: str, key: str, *, optional: bool = False) -> np.ndarray | None:
        """A constant that becomes the layer's parameter ``key`` (its source: the initializer it is, or was
        transposed or reshaped from). One that another layer took already is that layer's too in the model:
        tied, or two equal constants an exporter merged (PyTorch's dynamo exporter merges equal
        initializers); it is copied, and the two trained apart, with a warning."""
        value = self.const(ins, i, what, optional=optional)
        if value is not None:
            source = self.origin.get(self.input_names[i], self.input_names[i])
            if source in self.owner:
                self.untied.append(
                    f"{source!r} ({self.owner[source]}, {what} of {self.node.name or self.node.op_type})"
                )
            self._taken.append((key, source))
        return value

    # -- layers -------------------------------------------------------------------------------------
    def add(
        self,
        layer: nn.Layer,
        inputs: Sequence[_Tensor],
        params: dict[str, np.ndarray | None] | None = None,
        chw: tuple[int, int, int] | None = None,
        lifted: bool = False,
        name: str | None = None,
    ) -> _Tensor:
        try:
            shape = tuple(layer.output_shape([t.shape for t in inputs]))
        except (ShapeError, ValueError) as exc:
            raise _Refuse(str(exc)) from None
        node = self.graph.add(layer, *(t.node for t in inputs), name=name or self._name())
        for key, source in self._taken:
            self.owner.setdefault(source, node.name)
            if f"{source}" not in self.sources.values():
                self.sources[f"{node.name}.{key}"] = source
        self._taken = []
        params = dict(params or {})
        for key, spec in layer.param_specs([t.shape for t in inputs]).items():
            if spec.init == "value" and params.get(key) is None:  # a constant the layer holds (ConstantOp)
                params[key] = spec.value
        for key, value in params.items():
            if value is not None:
                self.params[f"{node.name}.{key}"] = np.ascontiguousarray(value, dtype=np.float32)
        return _Tensor(node, shape, chw, lifted=lifted, lead=self.lead)

    def _name(self) -> str:
        """A layer name from the ONNX node's: PyTorch's scope path ``/layer1/layer1.0/conv1/Conv`` gives
        ``layer1.0.conv1`` (its module's name, so that parameters are named as in the module's state dict)."""
        node = self.node
        parts = [p for p in (node.name or "").strip("/").split("/") if p]
        if parts and re.fullmatch(re.escape(node.op_type) + r"(_\d+)?", parts[-1]):
            parts = parts[:-1]  # the op type (and its count) that ends the path
        kept = [p for p, q in zip(parts, parts[1:] + [""]) if not q.startswith(p + ".")]
        return _unique(".".join(kept), node.op_type.lower(), self.graph)


# -- converters ------------------------------------------------------------------------------------
def _real(value: Any) -> float:
    """An ONNX float (32 bits) as the decimal it was written from: the shortest that rounds to it (a
    momentum written as 0.9 reads 0.9, not 0.8999999762), so that a model saved by vmem imports with its
    own hyperparameters."""
    return float(str(np.float32(value)))


def _ints(attrs: dict[str, Any], key: str, default: Sequence[int]) -> list[int]:
    return [int(v) for v in attrs.get(key, default)]


# -- layouts ---------------------------------------------------------------------------------------
def _as_image(b: _Builder, x: _Tensor, what: str) -> _Tensor:
    """``x`` as vmem's image (N, C, H, W): a lifted 4-D tensor is copied into the image layout."""
    if x.lead:
        raise _Refuse(
            f"its {what} must be an (N, C, H, W) map: a model imported with batch=False has no batch axis, and "
            "so no images"
        )
    if len(x.dims) != 4 or x.nhwc or x.chw is not None:
        raise _Refuse(f"its {what} has shape {x.dims}: vmem's {what} must be an (N, C, H, W) map")
    if x.lifted:
        return b.add(nn.Reshape(x.dims[1:]), [x])
    return x


def _as_tensor(b: _Builder, x: _Tensor) -> _Tensor:
    """``x`` where an op reads its axes as the model's: an image (stored channels-last) held lifted."""
    if x.image:
        return b.add(nn.Reshape((1,) + x.shape[1:]), [x], lifted=True)
    return x


def _reshaped(b: _Builder, x: _Tensor, dims: Sequence[int]) -> _Tensor:
    """``x`` holding the model's shape ``dims`` (as many values; at batch 1 where the model has a batch axis):
    a flatten of a map, a vmem Reshape (a view, or a copy where a side is 4-D), or ``x`` itself."""
    dims = tuple(int(d) for d in dims)
    if dims == x.dims:
        return x
    if not x.lead and len(dims) == 2 and x.image:
        return _flat(b, x)
    if x.nhwc or x.chw is not None:
        raise _Refuse("reshapes a flattened or transposed map other than to (N, features)")
    rest = dims if x.lead else dims[1:]
    lifted = len(rest) == 3  # vmem rank 4: not an image
    return b.add(nn.Reshape(((1,) + rest) if lifted else rest), [x], lifted=lifted)


def _no_batch_axis(b: _Builder, axes: Sequence[int], what: str) -> None:
    if not b.lead and 0 in axes:
        raise _Refuse(
            f"{what} the batch axis (axis 0), which vmem keeps apart; import a model whose first axis is not a "
            "batch with vmem.onnx.load(..., batch=False)"
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

    def convert(b: _Builder, ins: list[Any], attrs: dict[str, Any]) -> list[Any]:
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
    def convert(b: _Builder, ins: list[Any], attrs: dict[str, Any]) -> list[Any]:
        x = _as_image(b, b.tensor(ins, 0, "input"), "input")
        window = (x.shape[2], x.shape[3])
        return [b.add(nn.AvgPool2d(window) if average else nn.MaxPool2d(window), [x])]

    return convert


_converts("GlobalAveragePool", 1, 22)(_global(True))
_converts("GlobalMaxPool", 1, 22)(_global(False))


@_converts("Conv", 1, 11, 22)
def _conv(b: _Builder, ins: list[Any], attrs: dict[str, Any]) -> list[Any]:
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
def _batchnorm(b: _Builder, ins: list[Any], attrs: dict[str, Any]) -> list[Any]:
    x = _as_image(b, b.tensor(ins, 0, "input"), "input")
    scale, shift = b.weight(ins, 1, "scale", "weight"), b.weight(ins, 2, "bias", "bias")
    mean = b.weight(ins, 3, "running mean", "running_mean")
    var = b.weight(ins, 4, "running variance", "running_var")
    momentum = _real(attrs.get("momentum", 0.9))  # ONNX's: the weight of the old running value
    layer = nn.BatchNorm2d(x.shape[1], eps=_real(attrs.get("epsilon", 1e-5)), momentum=round(1.0 - momentum, 12))
    y = b.add(layer, [x], {"weight": scale, "bias": shift, "running_mean": mean, "running_var": var})
    stats = _Unusable("batch norm's running statistics as outputs (training-mode export): vmem keeps them itself")
    return [y, stats, stats]


def _elementwise(make: Callable[[], nn.Layer]) -> Callable[..., list[Any]]:
    def convert(b: _Builder, ins: list[Any], attrs: dict[str, Any]) -> list[Any]:
        x = b.tensor(ins, 0, "input", chw=True)
        return [b.add(make(), [x], chw=x.chw, lifted=x.lifted)]

    return convert


_converts("Relu", 6, 13, 14)(_elementwise(nn.ReLU))
_converts("Sigmoid", 6, 13)(_elementwise(nn.Sigmoid))
_converts("Tanh", 6, 13)(_elementwise(nn.Tanh))
_converts("Erf", 9, 13)(_elementwise(nn.Erf))


@_converts("Gelu", 20)
def _gelu(b: _Builder, ins: list[Any], attrs: dict[str, Any]) -> list[Any]:
    approximate = attrs.get("approximate", "none")
    if approximate not in nn.GELU.APPROXIMATIONS:
        raise _Refuse(f"approximate={approximate!r} (vmem's GELU takes {', '.join(nn.GELU.APPROXIMATIONS)})")
    x = b.tensor(ins, 0, "input", chw=True)
    return [b.add(nn.GELU(approximate), [x], chw=x.chw, lifted=x.lifted)]


@_converts("Clip", 6, 11, 12, 13)
def _clip(b: _Builder, ins: list[Any], attrs: dict[str, Any]) -> list[Any]:
    x = b.tensor(ins, 0, "input", chw=True)
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
def _pad(b: _Builder, ins: list[Any], attrs: dict[str, Any]) -> list[Any]:
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


@_converts("ReduceMean", 1, 11, 13, 18)
def _reduce_mean(b: _Builder, ins: list[Any], attrs: dict[str, Any]) -> list[Any]:
    """The mean over axes: over a map's height and width (what exporters write for adaptive average pooling
    to 1x1) a global average pool; over others a Mean. Reduced axes kept, then dropped by a reshape where
    ``keepdims=0``."""
    x = b.tensor(ins, 0, "input")
    rank = len(x.dims)
    if b.opset >= 18:
        given = b.const(ins, 1, "axes", optional=True)
        if (given is None or given.size == 0) and int(attrs.get("noop_with_empty_axes", 0)):
            return [x]
        axes = list(range(rank)) if given is None or given.size == 0 else [int(a) for a in given.reshape(-1)]
    else:
        axes = _ints(attrs, "axes", range(rank))
    axes = sorted({a % rank for a in axes})
    _no_batch_axis(b, axes, "averages over")
    if x.image and axes == [2, 3]:
        y = b.add(nn.AvgPool2d((x.shape[2], x.shape[3])), [x])
    else:
        x = _as_tensor(b, x)
        y = b.add(nn.Mean([x.axis(a) for a in axes]), [x], lifted=x.lifted)
    if int(attrs.get("keepdims", 1)):
        return [y]
    return [_reshaped(b, y, [d for a, d in enumerate(y.dims) if a not in axes])]


def _bias_of_linear(b: _Builder, x: _Tensor, value: np.ndarray, at: int) -> _Tensor | None:
    """``MatMul(x, W) + bias`` as exporters write a linear layer over a sequence: the bias becomes the
    Linear's own (trainable, not a constant added), where the product feeds nothing else."""
    layer = x.node.layer
    product = b.input_names[1 - at] if len(b.input_names) > 1 else ""
    if (
        not isinstance(layer, nn.Linear)
        or layer.bias
        or x.lifted
        or b.readers.get(product, 0) != 1
        or value.reshape(-1).shape != (layer.out_features,)
        or (value.ndim > 1 and value.shape[-1] != layer.out_features)
        or any(n.layer is layer for n in b.graph._nodes if n is not x.node)
    ):
        return None
    source = b.input_names[at]
    if source in b.owner:
        return None  # a parameter of another layer already: a constant here
    layer.bias = True
    b.params[f"{layer.name}.bias"] = np.ascontiguousarray(value.reshape(-1), dtype=np.float32)
    b.owner[source] = str(layer.name)
    b.sources[f"{layer.name}.bias"] = source
    return x


def _same_order(xs: list[_Tensor]) -> tuple[int, int, int] | None:
    orders = {x.chw for x in xs}
    if len(orders) > 1:
        raise _Refuse("its inputs are maps flattened in different orders")
    return orders.pop()


def _alike(b: _Builder, xs: list[_Tensor], what: str) -> list[_Tensor]:
    """Operands of a join in one layout: of one rank as the model sees them (lower ones given leading axes of
    length 1, NumPy's broadcast, where the model has no batch axis), images held lifted where another
    operand is lifted."""
    rank = max(len(x.dims) for x in xs)
    if any(len(x.dims) != rank for x in xs):
        if not b.lead:
            raise _Refuse(
                f"{what} tensors of shapes {[x.dims for x in xs]}: broadcasting a lower rank would move the batch axis"
            )
        xs = [_reshaped(b, x, (1,) * (rank - len(x.dims)) + x.dims) for x in xs]
    if any(x.lifted for x in xs):
        xs = [_as_tensor(b, x) for x in xs]
    return xs


def _constant_for(x: _Tensor, value: np.ndarray) -> np.ndarray:
    """A constant operand of ``x`` (the model's broadcast) in vmem's layout: axes of length 1 where vmem has
    axes the model does not see."""
    if not x.hidden or value.ndim == 0:
        return value
    if value.ndim > len(x.dims):
        raise _Refuse(f"a constant of shape {value.shape} broadcast into a tensor of shape {x.dims}")
    value = value.reshape((1,) * (len(x.dims) - value.ndim) + value.shape)
    for axis in x.hidden:
        value = np.expand_dims(value, axis)
    return value


def _arith(op: str, both: Callable[[], nn.Layer] | None) -> Callable[..., list[Any]]:
    """An element-wise binary op: of two computed tensors (``both``, where vmem has the layer), or of a
    computed tensor and a constant, either way round (:class:`vmem.nn.ConstantOp`)."""
    flipped = {"add": "add", "mul": "mul", "sub": "rsub", "div": None}[op]

    def convert(b: _Builder, ins: list[Any], attrs: dict[str, Any]) -> list[Any]:
        a, c = ins[0], ins[1]
        if isinstance(a, _Tensor) and isinstance(c, _Tensor):
            if both is None:
                raise _Refuse(f"{op} of two computed tensors is not supported yet (one operand must be a constant)")
            xs = _alike(b, [b.tensor(ins, i, "operand", chw=True) for i in range(2)], op)
            return [b.add(both(), xs, chw=_same_order(xs), lifted=xs[0].lifted)]
        kind: str | None = op
        if isinstance(a, _Tensor):
            x, value = b.tensor(ins, 0, "operand", chw=True), np.asarray(c)
        else:
            x, value, kind = b.tensor(ins, 1, "operand", chw=True), np.asarray(a), flipped
        if kind is None:
            raise _Refuse("a constant divided by a computed tensor is not supported yet")
        if value.dtype.kind != "f":
            raise _Refuse(f"{op} of a feature map and a {value.dtype} constant")
        at = 1 if isinstance(a, _Tensor) else 0  # where the constant is
        fused = _bias_of_linear(b, x, value, at) if kind == "add" else None
        if fused is not None:
            return [fused]
        if x.chw is not None and value.size != 1:
            raise _Refuse("a constant combined with a map flattened in (C, H, W) order (vmem stores it (H, W, C))")
        if value.size == 1 and (
            kind in ("add", "sub") and value.item() == 0 or kind in ("mul", "div") and value.item() == 1
        ):
            return [x]  # x + 0, x * 1: nothing to do
        try:
            layer = nn.ConstantOp(kind, _constant_for(x, value))
        except ValueError as exc:
            raise _Refuse(str(exc)) from None
        return [b.add(layer, [x], chw=x.chw, lifted=x.lifted)]

    return convert


_converts("Add", 7, 13, 14)(_arith("add", nn.Add))
_converts("Sub", 7, 13, 14)(_arith("sub", nn.Sub))
_converts("Mul", 7, 13, 14)(_arith("mul", nn.Mul))
_converts("Div", 7, 13, 14)(_arith("div", nn.Div))


@_converts("Sum", 6, 8, 13)
def _sum(b: _Builder, ins: list[Any], attrs: dict[str, Any]) -> list[Any]:
    xs = [b.tensor(ins, i, "operand", chw=True) for i in range(len(ins))]
    if len(xs) == 1:
        return [xs[0]]
    xs = _alike(b, xs, "adds")
    return [b.add(nn.Add(), xs, chw=_same_order(xs), lifted=xs[0].lifted)]


@_converts("Concat", 4, 11, 13)
def _concat(b: _Builder, ins: list[Any], attrs: dict[str, Any]) -> list[Any]:
    xs = [b.tensor(ins, i, "input") for i in range(len(ins))]
    if len(xs) == 1:
        return [xs[0]]
    rank = len(xs[0].dims)
    axis = int(attrs["axis"]) % rank
    _no_batch_axis(b, [axis], "concatenates along")
    if any(len(x.dims) != rank for x in xs):
        raise _Refuse(f"concatenates tensors of shapes {[x.dims for x in xs]}")
    if not (axis == 1 and all(x.image for x in xs)):  # images join on channels; other axes as tensors
        xs = [_as_tensor(b, x) for x in xs]
    return [b.add(nn.Concat(xs[0].axis(axis)), xs, lifted=xs[0].lifted)]


def _flat(b: _Builder, x: _Tensor) -> _Tensor:
    """A map (N, C, H, W) -> (N, features) in ONNX's order. Where only Gemm or MatMul read it (a classifier),
    vmem's Flatten (a view) orders the features as it stores them, (H, W, C), and the result carries the
    (C, H, W) the weight reading it is permuted from (none where H = W = 1 or the map was transposed to
    (N, H, W, C) first: then the orders agree). Otherwise it is copied into ONNX's order (a Reshape)."""
    c, h, w = x.shape[1:]
    readers = set().union(*(b.reader_ops.get(o, set()) for o in b.node.output)) if b.node is not None else set()
    if not x.nhwc and h * w > 1 and not readers <= {"Gemm", "MatMul"}:
        return b.add(nn.Reshape((c * h * w,)), [x])
    chw = None if x.nhwc or h * w == 1 else (c, h, w)
    return b.add(nn.Flatten(), [x], chw=chw)


@_converts("Flatten", 9, 11, 13, 21, 23, 24, 25)
def _flatten(b: _Builder, ins: list[Any], attrs: dict[str, Any]) -> list[Any]:
    x = b.tensor(ins, 0, "input", nhwc=True)
    dims = x.dims
    axis = int(attrs.get("axis", 1))
    axis = axis + len(dims) if axis < 0 else axis
    if not b.lead and axis != 1:
        raise _Refuse(
            f"axis={attrs['axis']} merges the batch axis with others (vmem flattens after the batch axis, axis=1); "
            "import a model whose first axis is not a batch with vmem.onnx.load(..., batch=False)"
        )
    return [_reshaped(b, x, (int(np.prod(dims[:axis])), int(np.prod(dims[axis:]))))]


@_converts("Reshape", 5, 13, 14, 19, 21, 23, 24, 25)
def _reshape(b: _Builder, ins: list[Any], attrs: dict[str, Any]) -> list[Any]:
    x = b.tensor(ins, 0, "data", nhwc=True)
    target = b.const(ins, 1, "shape")
    assert target is not None
    dims = [int(d) for d in target.reshape(-1)]
    allowzero = bool(int(attrs.get("allowzero", 0)))
    if allowzero and 0 in dims:
        raise _Refuse("allowzero=1 with a 0 in the shape (an empty tensor)")
    if b.lead:  # the model's whole tensor: ONNX's rules as they are
        full = [x.dims[i] if d == 0 and i < len(x.dims) else d for i, d in enumerate(dims)]
        if full.count(-1) > 1 or min(full, default=1) < -1:
            raise _Refuse(f"shape {dims} is not a shape")
        return [_reshaped(b, x, _filled(full, int(np.prod(x.dims)), dims, x))]
    size = int(np.prod(x.dims[1:]))
    # the batch axis kept: copied (0), the batch's stand-in, or the batch size an export without a symbolic
    # batch axis wrote down (the model's own input says it)
    batch_kept = bool(dims) and dims[0] in (0, BATCH, b.static_batch)
    rest = [x.dims[i] if d == 0 and i < len(x.dims) else d for i, d in enumerate(dims)][1:]
    if not batch_kept and dims and dims[0] == -1 and -1 not in rest and int(np.prod(rest)) == size:
        batch_kept = True
    if not batch_kept or any(d >= BATCH or d < -1 for d in rest) or rest.count(-1) > 1:
        raise _Refuse(
            f"shape {dims}: vmem reshapes keep the batch axis (the shape depends on the batch size); import a "
            "model whose first axis is not a batch with vmem.onnx.load(..., batch=False)"
        )
    return [_reshaped(b, x, [x.dims[0]] + _filled(rest, size, dims, x))]


def _filled(target: list[int], size: int, dims: list[int], x: _Tensor) -> list[int]:
    """``target`` (a reshape's, without zeros) with its -1 made what ``size`` values need; refused where
    they do not fit (``dims``: the shape as the model gives it, for the message)."""
    target = list(target)
    if -1 in target:
        known = int(np.prod([d for d in target if d != -1]))
        if known == 0 or size % known:
            raise _Refuse(f"shape {dims} does not fit {x.dims}")
        target[target.index(-1)] = size // known
    if int(np.prod(target)) != size:
        raise _Refuse(f"cannot reshape {x.dims} to {dims}")
    return target


@_converts("Unsqueeze", 1, 11, 13, 21, 23, 24, 25)
def _unsqueeze(b: _Builder, ins: list[Any], attrs: dict[str, Any]) -> list[Any]:
    x = b.tensor(ins, 0, "data")
    given = _ints(attrs, "axes", []) if b.opset < 13 else [int(a) for a in b.const(ins, 1, "axes").reshape(-1)]  # type: ignore[union-attr]
    rank = len(x.dims) + len(given)
    axes = sorted(a % rank for a in given)
    _no_batch_axis(b, axes, "inserts an axis before")
    dims = list(x.dims)
    for a in axes:
        dims.insert(a, 1)
    return [_reshaped(b, x, dims)]


@_converts("Squeeze", 1, 11, 13, 21, 23, 24, 25)
def _squeeze(b: _Builder, ins: list[Any], attrs: dict[str, Any]) -> list[Any]:
    x = b.tensor(ins, 0, "data")
    if b.opset < 13:
        given = _ints(attrs, "axes", [])
    else:
        axes_given = b.const(ins, 1, "axes", optional=True)
        given = [] if axes_given is None else [int(a) for a in axes_given.reshape(-1)]
    rank = len(x.dims)
    first = 0 if b.lead else 1
    axes = sorted(int(a) % rank for a in given) or [a for a in range(first, rank) if x.dims[a] == 1]
    _no_batch_axis(b, axes, "squeezes")
    if any(x.dims[a] != 1 for a in axes):
        raise _Refuse(f"squeezes axes {axes} of {x.dims}: an axis longer than 1")
    return [_reshaped(b, x, [d for a, d in enumerate(x.dims) if a not in axes])]


def _linear_weight(x: _Tensor, w: np.ndarray) -> np.ndarray:
    """A (out, in) weight in the order vmem stores the input's features (see :func:`_flat`)."""
    if x.chw is None:
        return w
    c, h, ww = x.chw
    return w.reshape(w.shape[0], c, h, ww).transpose(0, 2, 3, 1).reshape(w.shape[0], -1)


def _transposed(b: _Builder, x: _Tensor, perm: Sequence[int]) -> _Tensor:
    """``x`` with the model's axes in the order ``perm`` (vmem's hidden axes stay where they are)."""
    perm = [int(p) % len(x.dims) for p in perm]
    if perm == list(range(len(x.dims))):
        return x
    _no_batch_axis(b, [] if perm[0] == 0 else [0], "moves")
    if x.image:
        return b.add(nn.Transpose(perm), [x])  # a map, permuted through its stored order
    at = [x.axis(a) for a in range(len(x.dims))]
    order = list(range(len(x.shape)))
    for k, p in enumerate(perm):
        order[at[k]] = at[p]
    return b.add(nn.Transpose(order), [x], lifted=x.lifted)


@_converts("Gemm", 9, 11, 13)
def _gemm(b: _Builder, ins: list[Any], attrs: dict[str, Any]) -> list[Any]:
    x = b.tensor(ins, 0, "input A", chw=True)
    if len(x.dims) != 2:
        raise _Refuse(f"its input A has shape {x.dims}: Gemm multiplies matrices")
    if int(attrs.get("transA", 0)):
        _no_batch_axis(b, [0], "transA=1 moves")
        x = _transposed(b, x, [1, 0])
    w = b.weight(ins, 1, "weights B", "weight")
    c = b.const(ins, 2, "bias C", optional=True)
    assert w is not None
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    w = w if int(attrs.get("transB", 0)) else w.T  # (out, in)
    out, inp = w.shape
    if inp != x.dims[1]:
        raise _Refuse(f"weights of shape {w.shape} (out, in) do not match an input of {x.dims[1]} features")
    bias, matrix = None, None
    if c is not None and beta != 0:
        if c.size in (1, out) and (c.ndim < 2 or c.shape[0] == 1):  # one bias per output feature
            b.weight(ins, 2, "bias C", "bias")
            bias = np.broadcast_to(c.reshape(-1), (out,)) * beta
        elif b.lead:  # a bias per element of the product: a constant added
            matrix = np.broadcast_to(c, (x.dims[0], out)) * beta
        else:
            raise _Refuse(f"bias C of shape {c.shape}: a bias per sample (vmem adds one per output feature)")
    layer = nn.Linear(inp, out, bias=bias is not None)
    y = b.add(layer, [x], {"weight": _linear_weight(x, w * alpha), "bias": bias})
    if matrix is not None:
        y = b.add(nn.ConstantOp("add", _constant_for(y, matrix)), [y])
    return [y]


def _matrices(b: _Builder, a: _Tensor, m: _Tensor) -> tuple[_Tensor, _Tensor, tuple[int, ...]]:
    """MatMul's operands as vmem multiplies them (batches of matrices of one rank, the leading axes equal or
    1), by ONNX's rules: a vector A is a row, a vector B a column, a lower rank given leading axes of length 1
    (where the model has no batch axis). Also the model's shape of the product."""
    da, dm = a.dims, m.dims
    if not b.lead and (len(da) < 3 or len(da) != len(dm)):
        raise _Refuse(
            f"multiplies tensors of shapes {da} and {dm}: vmem multiplies batches of matrices of one rank, the "
            "batch axis first"
        )
    ra = (1,) + da if len(da) == 1 else da
    rm = dm + (1,) if len(dm) == 1 else dm
    rank = max(len(ra), len(rm))
    ra, rm = (1,) * (rank - len(ra)) + ra, (1,) * (rank - len(rm)) + rm
    out = tuple(max(i, j) for i, j in zip(ra[:-2], rm[:-2])) + (ra[-2], rm[-1])
    if len(da) == 1:
        out = out[:-2] + out[-1:]
    if len(dm) == 1:
        out = out[:-1]
    return _as_tensor(b, _reshaped(b, a, ra)), _as_tensor(b, _reshaped(b, m, rm)), out


@_converts("MatMul", 9, 13)
def _matmul(b: _Builder, ins: list[Any], attrs: dict[str, Any]) -> list[Any]:
    if isinstance(ins[1], np.ndarray):  # x @ W: a linear layer without a bias
        x = b.tensor(ins, 0, "input A", chw=True)
        w = b.weight(ins, 1, "weights B", "weight")
        assert w is not None
        if w.ndim not in (1, 2) or x.dims[-1] != w.shape[0] or (x.chw is not None and len(x.dims) != 2):
            raise _Refuse(f"multiplies {x.dims} by a constant {w.shape}: vmem's Linear takes a 2-D weight")
        x = _as_tensor(b, x)
        column = w.ndim == 1
        w2 = w.reshape(-1, 1) if column else w
        layer = nn.Linear(int(w2.shape[0]), int(w2.shape[1]), bias=False)
        y = b.add(layer, [x], {"weight": _linear_weight(x, w2.T)}, lifted=x.lifted)
        return [_reshaped(b, y, y.dims[:-1]) if column else y]
    a, m = b.tensor(ins, 0, "input A"), b.tensor(ins, 1, "input B")
    a, m, out = _matrices(b, a, m)
    y = b.add(nn.MatMul(), [a, m], lifted=a.lifted)
    return [_reshaped(b, y, out)]


@_converts("Gather", 1, 11, 13)
def _gather(b: _Builder, ins: list[Any], attrs: dict[str, Any]) -> list[Any]:
    """Rows of a constant table at computed indices (token ids): an embedding, its table trainable. Or
    positions of a computed tensor at constant indices along a non-batch axis (``x[:, 0]``, a classifier's
    first token: a Split; several: a Take)."""
    if isinstance(ins[0], _Tensor):
        return [_select(b, ins, attrs)]
    table = b.weight(ins, 0, "table", "weight")
    ids = b.tensor(ins, 1, "indices")
    assert table is not None
    if int(attrs.get("axis", 0)) != 0 or table.ndim != 2:
        raise _Refuse(f"gathers axis {attrs.get('axis', 0)} of a {table.ndim}-D constant: vmem's embedding takes rows")
    return [b.add(nn.Embedding(int(table.shape[0]), int(table.shape[1])), [ids], {"weight": table})]


def _select(b: _Builder, ins: list[Any], attrs: dict[str, Any]) -> _Tensor:
    x = _as_tensor(b, b.tensor(ins, 0, "data"))
    index = b.const(ins, 1, "indices")
    assert index is not None
    if index.dtype.kind not in "iu":
        raise _Refuse(f"indices of type {index.dtype}")
    axis = int(attrs.get("axis", 0)) % len(x.dims)
    _no_batch_axis(b, [axis], "gathers along")
    length = x.dims[axis]
    if index.size == 0 or (index < -length).any() or (index >= length).any():
        raise _Refuse(f"indices {index.reshape(-1).tolist()} out of range for axis {axis} of {x.dims}")
    at = [int(i) % length for i in index.reshape(-1)]
    if len(at) == 1:
        piece = b.add(nn.Split(length, at[0], x.axis(axis)), [x], lifted=x.lifted)
    else:
        piece = b.add(nn.Take(at, x.axis(axis)), [x], lifted=x.lifted)
    return _reshaped(b, piece, x.dims[:axis] + index.shape + x.dims[axis + 1 :])


@_converts("LayerNormalization", 17)
def _layer_norm(b: _Builder, ins: list[Any], attrs: dict[str, Any]) -> list[Any]:
    x = _as_tensor(b, b.tensor(ins, 0, "input"))
    scale = b.weight(ins, 1, "scale", "weight")
    bias = b.weight(ins, 2, "bias", "bias", optional=True)
    assert scale is not None
    axis = int(attrs.get("axis", -1)) % len(x.dims)
    if axis != len(x.dims) - 1 or scale.reshape(-1).shape != (x.dims[-1],):
        raise _Refuse(f"normalises axes {axis}.. of {x.dims}: vmem's LayerNorm normalises the last axis")
    if int(attrs.get("stash_type", 1)) != 1:
        raise _Refuse("stash_type other than float32")
    features = x.dims[-1]
    layer = nn.LayerNorm(features, eps=_real(attrs.get("epsilon", 1e-5)))
    params: dict[str, np.ndarray | None] = {
        "weight": scale.reshape(-1),
        "bias": np.zeros(features) if bias is None else bias.reshape(-1),
    }
    return [b.add(layer, [x], params, lifted=x.lifted), *_stats()]


def _stats() -> list[Any]:
    unusable = _Unusable("the mean and inverse deviation LayerNormalization may also give")
    return [unusable, unusable]


@_converts("Identity", 1, 13, 14, 16, 19, 21, 23, 24, 25)
def _identity(b: _Builder, ins: list[Any], attrs: dict[str, Any]) -> list[Any]:
    return [b.tensor(ins, 0, "input", chw=True, nhwc=True)]


@_converts("Dropout", 7, 10, 12, 13, 22)
def _dropout(b: _Builder, ins: list[Any], attrs: dict[str, Any]) -> list[Any]:
    x = b.tensor(ins, 0, "input", chw=True)
    if b.opset < 12:
        ratio = _real(attrs.get("ratio", 0.5))
    else:
        given = b.const(ins, 1, "ratio", optional=True)
        ratio = 0.5 if given is None else _real(given)
    mask = _Unusable("dropout's mask")
    if ratio == 0:
        return [x, mask]
    return [b.add(nn.Dropout(ratio), [x], chw=x.chw, lifted=x.lifted), mask]


@_converts("Softmax", 1, 11, 13)
def _softmax(b: _Builder, ins: list[Any], attrs: dict[str, Any]) -> list[Any]:
    x = _as_tensor(b, b.tensor(ins, 0, "input"))
    rank = len(x.dims)
    default = -1 if b.opset >= 13 else 1
    axis = int(attrs.get("axis", default)) % rank
    if b.opset < 13 and axis != rank - 1:  # before 13 the input was coerced to 2-D at the axis
        raise _Refuse(f"axis={axis} of a rank-{rank} input (opset {b.opset} softmaxes the flattened tail)")
    _no_batch_axis(b, [axis], "softmaxes along")
    return [b.add(nn.Softmax(x.axis(axis)), [x], lifted=x.lifted)]


@_converts("Transpose", 1, 13, 21, 23, 24, 25)
def _transpose(b: _Builder, ins: list[Any], attrs: dict[str, Any]) -> list[Any]:
    x = b.tensor(ins, 0, "input")
    perm = _ints(attrs, "perm", list(range(len(x.dims)))[::-1])
    if x.image and perm == [0, 2, 3, 1]:
        return [_Tensor(x.node, x.shape, None, True)]  # read only by a flatten, in vmem's own order
    return [_transposed(b, x, perm)]


@_converts("Cast", 6, 9, 13, 19, 21, 23, 24, 25, 28)
def _cast(b: _Builder, ins: list[Any], attrs: dict[str, Any]) -> list[Any]:
    onnx = _onnx()
    to = int(attrs["to"])
    if to != onnx.TensorProto.FLOAT:
        raise _Refuse(
            f"casts a feature map to {onnx.TensorProto.DataType.Name(to).lower()}: vmem's feature maps are float32 "
            "(or the half precision a Trainer's precision= asks for), not the model's choice"
        )
    return [b.tensor(ins, 0, "input", chw=True, nhwc=True)]


# -- GELU, as exporters write it ----------------------------------------------------------------------
def _gelus(onnx: Any, graph: Any, readers: dict[str, int]) -> tuple[dict[int, str], set[int]]:
    """GELU written out as ops, ``0.5 x (1 + erf(x / sqrt 2))`` in the orders exporters write it (the scale
    last, first, or on the bracket; ``x / sqrt 2`` as a Div or a Mul), each op's result read by the next
    alone: {the last node's index: x's name}, and the indices of the pattern's other nodes (not imported:
    the last becomes one :class:`vmem.nn.GELU`)."""
    scalars: dict[str, float] = {}
    for t in graph.initializer:
        if int(np.prod(t.dims)) == 1:
            scalars[t.name] = float(onnx.numpy_helper.to_array(t).reshape(-1)[0])
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name in ("value", "value_float"):
            value = np.asarray(onnx.helper.get_attribute_value(node.attribute[0]))
            value = onnx.numpy_helper.to_array(value.item()) if value.dtype == object else value
            if value.size == 1:
                scalars[node.output[0]] = float(np.asarray(value).reshape(-1)[0])
    index = {out: i for i, node in enumerate(graph.node) for out in node.output}
    nodes = list(graph.node)

    def near(name: str, want: float) -> bool:
        return name in scalars and abs(scalars[name] - want) <= 1e-4 * abs(want)

    def only(name: str) -> bool:  # read by one node, not the model's output
        return readers.get(name, 0) == 1

    def made(name: str, op: str) -> int | None:
        i = index.get(name)
        return i if i is not None and nodes[i].op_type == op else None

    def other(node: Any, name: str) -> str | None:
        """The operand of a binary ``node`` beside ``name``."""
        ins = list(node.input)
        return ins[1 - ins.index(name)] if len(ins) == 2 and name in ins else None

    def reader(name: str, op: str) -> int | None:
        hits = [i for i, n in enumerate(nodes) if n.op_type == op and name in n.input]
        return hits[0] if len(hits) == 1 and only(name) else None

    fused: dict[int, str] = {}
    skipped: set[int] = set()
    for e, erf in enumerate(nodes):
        if erf.op_type != "Erf" or not only(erf.input[0]):
            continue
        scaled = index.get(erf.input[0])
        if scaled is None:
            continue
        sn = nodes[scaled]
        x = None
        if sn.op_type == "Div" and near(sn.input[1], math.sqrt(2)):
            x = sn.input[0]
        elif sn.op_type == "Mul":
            for k in range(2):
                if near(sn.input[k], 1 / math.sqrt(2)):
                    x = sn.input[1 - k]
        add = reader(erf.output[0], "Add")
        if x is None or x in scalars or add is None or not near(other(nodes[add], erf.output[0]) or "", 1.0):
            continue
        bracket = nodes[add].output[0]
        m1 = reader(bracket, "Mul")
        if m1 is None:
            continue
        with_it = other(nodes[m1], bracket) or ""
        half = made(with_it, "Mul")
        if with_it == x:  # x (1 + erf) then 0.5
            m2 = reader(nodes[m1].output[0], "Mul")
            if m2 is None or not near(other(nodes[m2], nodes[m1].output[0]) or "", 0.5):
                continue
            last, inner = m2, [scaled, e, add, m1]
        elif near(with_it, 0.5):  # 0.5 (1 + erf) then x
            m2 = reader(nodes[m1].output[0], "Mul")
            if m2 is None or other(nodes[m2], nodes[m1].output[0]) != x:
                continue
            last, inner = m2, [scaled, e, add, m1]
        elif half is not None and only(with_it) and near(other(nodes[half], x) or "", 0.5):  # (0.5 x) (1 + erf)
            last, inner = m1, [scaled, e, add, half]
        else:
            continue
        fused[last] = x
        skipped.update(inner)
    return fused, skipped


# -- the walk -------------------------------------------------------------------------------------
def _attrs(onnx: Any, node: Any) -> dict[str, Any]:
    out = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


def _fold(onnx: Any, node: Any, ins: list[Any], opset: int) -> list[Any]:
    """Outputs of a node whose inputs are all constants, by ONNX's reference implementation."""
    from onnx.reference import ReferenceEvaluator

    if node.op_type in ("ConstantOfShape", "Expand", "Tile", "Range", "RandomNormalLike", "RandomUniformLike"):
        if any(isinstance(v, np.ndarray) and v.dtype.kind in "iu" and (v >= BATCH).any() for v in ins):
            raise _Refuse("makes a constant whose size depends on the batch size")
    helper = onnx.helper
    names = [n for n in node.input if n]
    graph = helper.make_graph(
        [node],
        "fold",
        [helper.make_value_info(n, onnx.TypeProto()) for n in names],
        [helper.make_value_info(n, onnx.TypeProto()) for n in node.output],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    feeds = {n: v for n, v in zip(node.input, ins) if n}
    try:
        outs = ReferenceEvaluator(model).run(None, feeds)
    except Exception as exc:  # noqa: BLE001 - the reference implementation's own complaint, named
        raise _Refuse(f"could not be evaluated at import ({type(exc).__name__}: {exc})") from None
    out = [np.asarray(v) for v in outs]
    if any(v.size > _MOST_FOLDED for v in out):
        raise _Refuse("computes a constant of more than 4M values at import")
    return out


def _shape_of(x: _Tensor, attrs: dict[str, Any]) -> np.ndarray:
    shape = (x.shape[0], x.shape[2], x.shape[3], x.shape[1]) if x.nhwc else x.dims
    dims = np.array(shape if x.lead else (BATCH,) + tuple(shape[1:]), np.int64)
    start, end = int(attrs.get("start", 0)), attrs.get("end")
    return dims[start : None if end is None else int(end)]


def load(
    model: Any,
    *,
    input_shape: Sequence[int] | None = None,
    name: str | None = None,
    batch: bool = True,
    base_dir: str | os.PathLike | None = None,
) -> Graph:
    """An ONNX model as a trainable :class:`vmem.Graph` holding its weights (``net.params``).

    ``model``: a path, the file's bytes, or an ``onnx.ModelProto``. ``input_shape``: the input's shape
    without the batch axis (``(C, H, W)``), where the model leaves it symbolic (None for a dimension the
    model fixes: ``(None, 64, 64)``); the batch axis is always the network's own. ``name``: the network's
    name (default the model graph's).

    ``batch``: whether the model's first axis is a batch (every input's, and every tensor it computes from
    them; the default). ``batch=False``: the model computes on one sample, its axes all its own (ops may
    concatenate, transpose, reduce along its first axis): vmem adds its batch axis in front of every input
    and of the output (a Trainer then takes arrays of shape (N, *model input shape)), and ``input_shape`` is
    the input's whole shape. Such a model has no images: convolutions and poolings are refused.

    The model must have one output; its inputs become the network's (``net.inputs``, in the model's
    order: a Trainer then takes a tuple of arrays), each with a batch axis. Every node becomes a vmem layer (see
    :func:`supported`) or, where all its inputs are constants, a constant evaluated at import. Raises
    :class:`~vmem.errors.OnnxError` naming every node that cannot be imported (its op, op version and the
    model's opset) before building anything; FileNotFoundError for a missing file.

    External data (weights kept in files beside the model) is read only from the model's own folder, or for
    a model given as bytes or a ModelProto only from ``base_dir`` (none is read where it is not given):
    each file resolved, confined to that folder and a regular file (see :mod:`vmem.onnx._data`)."""
    onnx = _onnx()
    proto, source = _data.read(onnx, model, base_dir)
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None:
        raise OnnxError(f"{source}: imports no version of the default ONNX domain")
    newest = int(onnx.defs.onnx_opset_version())
    if opset > newest:
        raise OnnxError(
            f"{source}: opset {opset} is newer than any vmem knows (the newest its ONNX package knows is "
            f"{newest}); export it at opset {newest} or older"
        )
    if opset < MIN_OPSET:
        raise OnnxError(
            f"{source}: opset {opset} is older than vmem imports (opset {MIN_OPSET} or later); convert it with "
            "onnx.version_converter.convert_version(model, 13)"
        )
    graph = proto.graph
    values: dict[str, Any] = _data.arrays(onnx, proto, source)
    initializers = set(values)
    inputs = [i for i in graph.input if i.name not in values]
    if not inputs:
        raise OnnxError(f"{source}: has no input that is not a constant; vmem imports models that take a batch")
    inp = inputs[0]
    shape = _input_shape(onnx, inp, input_shape, source, batch)
    if len(graph.output) != 1:
        raise OnnxError(f"{source}: has {len(graph.output)} outputs; vmem imports models with one output")
    net = Graph(input_shape=shape, name=name or re.sub(r"[^0-9A-Za-z_]+", "_", graph.name or "onnx").strip("_"))
    builder = _Builder(net, opset)
    builder.lead = not batch
    for node in graph.node:
        for used in node.input:
            builder.readers[used] = builder.readers.get(used, 0) + 1
            builder.reader_ops.setdefault(used, set()).add(node.op_type)
    for out in graph.output:
        builder.readers[out.name] = builder.readers.get(out.name, 0) + 1
        builder.reader_ops.setdefault(out.name, set()).add("")
    first = inp.type.tensor_type.shape.dim
    if batch and first and first[0].HasField("dim_value") and first[0].dim_value > 0:
        builder.static_batch = int(first[0].dim_value)
    values[inp.name] = _entry(builder, net.input, shape)
    for other in inputs[1:]:  # the network's other inputs, in the model's order (each with a batch axis)
        other_shape = _input_shape(onnx, other, None, source, batch)
        values[other.name] = _entry(builder, net.add_input(other_shape, _unique(other.name, "input", net)), other_shape)
    refused: list[str] = []

    def version(op: str) -> int:
        try:
            return int(onnx.defs.get_schema(op, opset, "").since_version)
        except Exception:  # noqa: BLE001 - an op ONNX's own schemas do not know
            return -1

    fused, skipped = _gelus(onnx, graph, builder.readers)
    for at, node in enumerate(graph.node):
        if at in skipped:  # a part of a GELU: the pattern's last node makes it
            continue
        ins = [values.get(n) if n else None for n in node.input]
        if at in fused:  # GELU's last op: one layer of GELU's input
            ins = [values.get(fused[at])]
        where = f"node {node.name or node.output[0]!r} ({node.op_type} v{version(node.op_type)})"
        outs: list[Any] = []
        if any(v is _REFUSED for v in ins):  # downstream of a refused node: that node is named already
            values.update((n, _REFUSED) for n in node.output if n)
            continue
        try:
            missing = [n for n, v in zip(node.input, ins) if n and v is None]
            if node.domain not in ("", "ai.onnx"):
                raise _Refuse(f"the custom domain {node.domain!r} is not supported")
            if missing:
                raise _Refuse(f"reads {missing[0]!r}, which no earlier node computes")
            unusable = [v.reason for v in ins if isinstance(v, _Unusable)]
            if unusable:
                raise _Refuse(f"reads {unusable[0]}")
            attrs = _attrs(onnx, node)
            builder.start(node)
            if at in fused:
                x = builder.tensor(ins, 0, "input (GELU's)", chw=True)
                outs = [builder.add(nn.GELU(), [x], chw=x.chw, lifted=x.lifted)]
            elif node.op_type == "Shape" and isinstance(ins[0], _Tensor):
                outs = [_shape_of(ins[0], attrs)]
            elif all(isinstance(v, np.ndarray) or v is None for v in ins):
                outs = _fold(onnx, node, ins, opset)
                first = node.input[0] if node.input else ""
                if node.op_type in _SAME_VALUES and (first in initializers or first in builder.origin):
                    builder.origin[node.output[0]] = builder.origin.get(first, first)
            else:
                converter = _CONVERTERS.get(node.op_type)
                if converter is None:
                    raise _Refuse("not supported")
                if version(node.op_type) not in converter.versions:
                    raise _Refuse(
                        f"op version {version(node.op_type)} (the model's opset {opset}) is not one vmem "
                        f"converts (versions {', '.join(map(str, converter.versions))})"
                    )
                outs = converter.fn(builder, ins, attrs)
        except _Refuse as exc:
            refused.append(f"{where}: {exc}")
            values.update((n, _REFUSED) for n in node.output if n)
            continue
        for i, out_name in enumerate(node.output):
            if out_name:
                values[out_name] = outs[i] if i < len(outs) else _Unusable(f"an output of {where} not imported")
    if refused:
        raise OnnxError(
            f"{source} (opset {opset}): {len(refused)} node(s) cannot be imported:\n  "
            + "\n  ".join(refused[:20])
            + (f"\n  ... and {len(refused) - 20} more" if len(refused) > 20 else "")
            + f"\nOps vmem converts: {', '.join(supported())}; any op whose inputs are all constants is "
            "evaluated at import."
        )
    out = values.get(graph.output[0].name)
    if not isinstance(out, _Tensor):
        raise OnnxError(f"{source}: its output {graph.output[0].name!r} is not computed from its inputs")
    builder.start(next((n for n in graph.node if graph.output[0].name in n.output), graph.node[-1]))
    if out.nhwc:  # the model ends in a transposed map: made now
        out = builder.add(nn.Transpose((0, 2, 3, 1)), [_Tensor(out.node, out.shape)])
    if out.lifted:  # held 5-D inside the network; the output as the model gives it (vmem stores 4-D channels-last)
        out = builder.add(nn.Reshape(out.shape[2:]), [out])
    if out.node.layer is None:  # the output is an input: a layer passes it on
        out = builder.add(nn.Identity(), [out], name=_unique(graph.output[0].name, "output", net))
    if out.chw is not None:
        raise OnnxError(
            f"{source}: its output is a flattened feature map, which vmem orders (H, W, C); "
            "end the model in a layer that mixes the features (Gemm, MatMul)"
        )
    net.output(out.node)
    net.sources = {k: v for k, v in builder.sources.items() if k in builder.params}
    if builder.untied:
        import warnings

        warnings.warn(
            f"{source}: {len(builder.untied)} initializer(s) are parameters of more than one layer, each layer "
            f"given its own copy (trained apart): {'; '.join(builder.untied[:5])}"
            + (" ..." if len(builder.untied) > 5 else ""),
            stacklevel=2,
        )
    try:
        net.load_state_dict(builder.params, source=source)
    except CheckpointError as exc:  # an op left unused (a dead branch) or a converter's slip: say so
        raise OnnxError(f"{source}: the imported weights do not match the network built: {exc}") from None
    return net


def _unique(name: str, fallback: str, net: Graph) -> str:
    """``name`` made a name of ``net``'s (letters, digits, ``_`` and ``.``; ``fallback`` where nothing is
    left), ``_2``, ``_3``... added where a layer or an input has it already."""
    base = re.sub(r"[^0-9A-Za-z_.]+", "_", name).strip("_.") or fallback
    taken = {str(layer.name) for layer in net.layers} | {node.name for node in net.inputs}
    out, k = base, 1
    while out in taken:
        k += 1
        out = f"{base}_{k}"
    return out


def _entry(b: _Builder, node: Node, shape: tuple[int, ...]) -> _Tensor:
    """An input of the network, of vmem shape (N, *shape): where the model has no batch axis and the input is
    3-D, held lifted (a Reshape), as vmem stores 4-D tensors as images."""
    x = _Tensor(node, (1,) + shape, lead=b.lead)
    if b.lead and len(shape) == 3:
        x = b.add(nn.Reshape((1,) + shape), [x], lifted=True, name=_unique(f"{node.name}.lifted", "input", b.graph))
    return x


def _input_shape(onnx: Any, inp: Any, given: Sequence[int] | None, source: str, batch: bool = True) -> tuple[int, ...]:
    tensor = inp.type.tensor_type
    if tensor.elem_type and np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)).kind not in "fiu":
        raise OnnxError(
            f"{source}: its input {inp.name!r} holds {onnx.TensorProto.DataType.Name(tensor.elem_type)} "
            "values; vmem takes numbers (integer inputs, token ids, travel as floats: exact up to 2^24)"
        )
    dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tensor.shape.dim]
    own = dims[1:] if batch else dims  # the axes after the batch axis, or all where the model has none
    if given is not None:
        given = tuple(given)
        if tensor.shape.dim and len(own) != len(given):
            raise OnnxError(f"{source}: input_shape={given} does not match the model's input {dims}")
        shape = tuple(own[i] if g is None else int(g) for i, g in enumerate(given))
        if any(d is None for d in shape) or any(d not in (None, s) for d, s in zip(own, shape)):
            raise OnnxError(f"{source}: input_shape={given} does not match the model's input {dims}")
        return shape  # type: ignore[return-value]
    if (batch and not dims) or any(d is None for d in own):
        raise OnnxError(
            f"{source}: its input {inp.name!r} has shape {['?' if d is None else d for d in dims]}; give the "
            + (
                "shape after the batch axis, e.g. load(path, input_shape=(3, 224, 224))"
                if batch
                else "whole shape (batch=False), e.g. load(path, input_shape=(4, 16), batch=False)"
            )
        )
    return tuple(int(d or 0) for d in own)
