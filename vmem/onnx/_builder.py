"""The ONNX importer's parts: the graph under construction and the weights it takes (:class:`_Builder`), the
values an ONNX tensor name stands for, the registry of converters (:func:`_converts`) and the helpers they
share."""

from __future__ import annotations

from fractions import Fraction

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import ModuleType

import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from .. import nn
from ..errors import ShapeError
from ..graph import Graph
from ..graph.network import Node

__all__ = ["MIN_OPSET", "BATCH", "supported"]

#: A converter's inputs (a computed :class:`_Tensor`, a constant array, a comparison not yet made, None for an
#: input left out), the node's attributes by name, and its outputs (one value per output of the node).
Ins = list[Any]
Attrs = dict[str, Any]
Outs = list[Any]

#: The oldest opset a model may declare (older ones carry attributes long removed, e.g. ``consumed_inputs``).
MIN_OPSET = 9
#: The batch axis's stand-in while shapes are computed at import (``Shape`` of a feature map): a prime that
#: no real dimension is, so that a reshape target keeping the batch axis is recognised as such.
BATCH = 1_000_003
#: Ops whose output holds its (first) input's values, rearranged: a weight made so keeps its initializer's
#: name. (Not Identity: an exporter that merges equal initializers names each copy after its own parameter,
#: ``bn1.running_mean = Identity(bn1.bias)`` while both are zeros.)
_SAME_VALUES = ("Transpose", "Cast", "Reshape", "Squeeze", "Unsqueeze", "Flatten")
#: The most bytes a constant computed at import may hold: a shape computation, or a weight a model computes
#: rather than stores (the onnx package's light models fill their fully connected weights so: VGG-19's fc6 is
#: 411 MB); never a feature map, whose size would depend on the batch (refused apart).
_MOST_FOLDED = 1 << 30
#: The most bytes all the constants computed at one import may hold together (a model of a few kilobytes
#: could otherwise make gigabytes, each constant under the cap above)
_MOST_FOLDED_TOTAL = 2 << 30


def _onnx() -> ModuleType:
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
    #: the model moved or merged the batch axis (:mod:`vmem.onnx._views`): for each of the model's axes, the
    #: vmem axes it is made of, in the model's row-major order; None for a plain tensor
    view: tuple[tuple[int, ...], ...] | None = None

    @property
    def hidden(self) -> tuple[int, ...]:
        """vmem's axes the model does not see."""
        if self.view is not None:
            named = {a for g in self.view for a in g}
            return tuple(i for i in range(len(self.shape)) if i not in named)
        return tuple(i for i, on in ((0, self.lead), (1, self.lifted)) if on)

    @property
    def dims(self) -> tuple[int, ...]:
        """The shape as the model sees it (at batch 1 where the model has a batch axis)."""
        if self.view is not None:
            return tuple(int(np.prod([self.shape[a] for a in g], dtype=np.int64)) for g in self.view)
        hidden = self.hidden
        return tuple(d for i, d in enumerate(self.shape) if i not in hidden)

    @property
    def image(self) -> bool:
        """A 4-D map as vmem stores images (the model's (N, C, H, W))."""
        return len(self.shape) == 4 and not self.lifted and not self.lead and self.view is None

    def axis(self, a: int) -> int:
        """vmem's axis for the model's axis ``a`` of this tensor."""
        if self.view is not None:
            g = self.view[a % len(self.view)]
            if len(g) != 1:
                raise _Refuse(f"reads axis {a} of a tensor whose axis {a} merges several (a reshape's)")
            return g[0]
        hidden = self.hidden
        return [i for i in range(len(self.shape)) if i not in hidden][a % len(self.dims)]


@dataclass(frozen=True)
class _Mask:
    """A comparison of a computed tensor with a constant (``x > 0.5``: a padding mask), not yet made: a Where
    that reads it becomes one :class:`vmem.nn.Select`; any other reader takes it as 0.0 and 1.0."""

    x: _Tensor
    cmp: str
    threshold: float

    def negated(self) -> "_Mask":
        flip = {
            ">": "<=",
            "<": ">=",
            ">=": "<",
            "<=": ">",
            "==": "!=",
            "!=": "==",
            "isnan": "notnan",
            "notnan": "isnan",
        }
        return _Mask(self.x, flip[self.cmp], self.threshold)


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

    def __init__(self, graph: Graph, opset: int, plain: Callable[["_Builder", "_Tensor", str], "_Tensor"]):
        self.graph = graph
        self.opset = opset
        #: a viewed value made plain for a converter that reads the batch axis first, or refused
        #: (:func:`vmem.onnx._views.plain`: views are a layer above the builder)
        self.plain = plain
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
        #: initializers more than one layer took as a parameter: (the initializer, what took it again)
        self.untied: list[tuple[str, str]] = []
        #: a constant gathered from a table's rows at fixed positions -> (the table, the positions, its rows)
        self.gathered: dict[str, tuple[str, np.ndarray, int]] = {}
        #: bytes of the constants computed at import so far (at most _MOST_FOLDED_TOTAL)
        self.folded = 0
        #: the model's initializers by name (its weights and buffers; a Constant node's value is not one)
        self.initializers: set[str] = set()
        #: a constant made by repeating one initializer (Expand, Tile: a class token expanded to the batch)
        #: -> that initializer
        self.tiled: dict[str, str] = {}

    def start(self, node: Any) -> None:
        """Convert ``node`` next."""
        self.node, self.input_names, self._taken = node, list(node.input), []

    # -- inputs of the node being converted --------------------------------------------------------
    def tensor(
        self, ins: list[Any], i: int, what: str, *, nhwc: bool = False, chw: bool = False, view: bool = False
    ) -> _Tensor:
        """Input ``i``, a computed tensor, as the converter reads it: a viewed one (the model moved its batch
        axis) only where the converter takes views (``view``), else made plain, or refused where the batch
        is not the model's first axis."""
        value = ins[i] if i < len(ins) else None
        if isinstance(value, _Mask):  # a comparison read as numbers: 1.0 where it holds, else 0.0
            x = value.x
            value = self.add(nn.Select(value.cmp, value.threshold, 1.0, 0.0), [x], chw=x.chw, lifted=x.lifted)
        if not isinstance(value, _Tensor):
            raise _Refuse(f"its {what} (input {i}) must be computed by the network, not a constant")
        if value.view is not None and not view:
            value = self.plain(self, value, what)
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
        initializers); it is copied, and the two trained apart, with a warning, unless it is a language
        model's head tied to its embedding (``_load.tie_heads``)."""
        value = self.const(ins, i, what, optional=optional)
        if value is not None:
            source = self.origin.get(self.input_names[i], self.input_names[i])
            if source in self.owner:
                self.untied.append(
                    (source, f"{source!r} ({self.owner[source]}, {what} of {self.node.name or self.node.op_type})")
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
        specs = layer.param_specs([t.shape for t in inputs])
        # the weights the node's converter took are this layer's where it has them: a layer added on the way
        # (a transpose arranging the input) leaves them to the layer that holds them
        mine = [(key, source) for key, source in self._taken if key in specs]
        self._taken = [(key, source) for key, source in self._taken if key not in specs]
        for key, source in mine:
            self.owner.setdefault(source, node.name)
            if f"{source}" not in self.sources.values():
                self.sources[f"{node.name}.{key}"] = source
        params = dict(params or {})
        exact = set()
        for key, spec in specs.items():
            if spec.init == "value" and params.get(key) is None:  # a constant the layer holds (ConstantOp)
                params[key] = spec.value
                exact.add(key)  # as the layer holds it (float64: a scale made from the model's shapes)
        for key, value in params.items():
            if value is not None:
                dtype = np.float64 if key in exact else np.float32
                self.params[f"{node.name}.{key}"] = np.ascontiguousarray(value, dtype=dtype)
        # a layer that keeps its one input's shape (an activation) keeps its view of the batch axis
        view = inputs[0].view if len(inputs) == 1 and shape == inputs[0].shape else None
        return _Tensor(node, shape, chw, lifted=lifted, lead=self.lead, view=view)

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
    """An ONNX float (32 bits) as the number it was written from: the shortest decimal that rounds to it
    where that has at most 6 digits (a momentum written as 0.9 reads 0.9, not 0.8999999762), else a fraction
    of a small denominator that rounds to it (PyTorch's hard-sigmoid writes 1/6 as 0.16666667: it computes
    with 1/6), else that shortest decimal; so that a model imports with the hyperparameters it was made with."""
    single = np.float32(value)
    text = str(single)
    digits = len(text.split("e")[0].replace("-", "").replace(".", "").strip("0"))
    if digits > 6 and np.isfinite(single):
        simple = Fraction(float(single)).limit_denominator(64)
        if np.float32(float(simple)) == single:
            return float(simple)
    return float(text)


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
