"""The ONNX importer: an ONNX model -> a trainable :class:`vmem.Graph` with the model's weights (see
:mod:`vmem.onnx`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import ModuleType

import os
import re
from typing import Any, Sequence

import numpy as np

from .. import nn
from ..errors import CheckpointError, OnnxError
from ..graph import Graph
from ..graph.network import Node
from . import _data, _views

from . import _convert_arith, _convert_image, _convert_mask, _convert_recurrent, _convert_shape, _convert_tensor  # noqa: F401  (register)
from ._fold import _fold, _shape_of
from ._fusions import _Pattern, _gelus, _layer_norms
from ._builder import (
    MIN_OPSET,
    _SAME_VALUES,
    _MOST_FOLDED_TOTAL,
    _onnx,
    _Refuse,
    _Mask,
    _Tensor,
    _Unusable,
    _REFUSED,
    _CONVERTERS,
    supported,
    _Builder,
    _unique,
)

__all__ = ["load", "supported", "MIN_OPSET"]


# -- the walk -------------------------------------------------------------------------------------
def _attrs(onnx: ModuleType, node: Any) -> dict[str, Any]:
    out = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


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
    walk = _Walk(onnx, proto, source, input_shape, name, batch)  # open and check
    for at, node in enumerate(proto.graph.node):  # convert one node at a time
        walk.convert(at, node)
    return walk.finish()  # the output, the weights, what was refused


class _Walk:
    """One import, in three stages (as onnx_chainer's ``graph.py`` walks a model): made, the model is opened
    and checked and the network's inputs made; :meth:`convert` converts one node (into layers, a constant
    computed at import, or a refusal kept for the report); :meth:`finish` refuses with every node that
    cannot be imported, or makes the output and loads the weights."""

    def __init__(
        self,
        onnx: ModuleType,
        proto: Any,
        source: str,
        input_shape: Sequence[int] | None,
        name: str | None,
        batch: bool,
    ):
        self.onnx, self.source, self.graph = onnx, source, proto.graph
        self.opset = _opset(onnx, proto, source)
        graph = proto.graph
        self.values: dict[str, Any] = {}  # each value of the model by name: an array, a tensor, a refusal
        self.values.update(_data.arrays(onnx, proto, source))
        self.initializers = set(self.values)
        inputs = [i for i in graph.input if i.name not in self.values]
        if not inputs:
            raise OnnxError(f"{source}: has no input that is not a constant; vmem imports models that take a batch")
        inp = inputs[0]
        shape = _input_shape(onnx, inp, input_shape, source, batch)
        if len(graph.output) != 1:
            raise OnnxError(f"{source}: has {len(graph.output)} outputs; vmem imports models with one output")
        net_name = name or re.sub(r"[^0-9A-Za-z_]+", "_", graph.name or "onnx").strip("_")
        self.net = net = Graph(input_shape=shape, name=net_name)
        self.builder = b = _Builder(net, self.opset, _views.plain)
        b.lead = not batch
        b.initializers = self.initializers
        for node in graph.node:
            for used in node.input:
                b.readers[used] = b.readers.get(used, 0) + 1
                b.reader_ops.setdefault(used, set()).add(node.op_type)
        for out in graph.output:
            b.readers[out.name] = b.readers.get(out.name, 0) + 1
            b.reader_ops.setdefault(out.name, set()).add("")
        first = inp.type.tensor_type.shape.dim
        if batch and first and first[0].HasField("dim_value") and first[0].dim_value > 0:
            b.static_batch = int(first[0].dim_value)
        self.values[inp.name] = _entry(b, net.input, shape)
        for other in inputs[1:]:  # the network's other inputs, in the model's order (each with a batch axis)
            other_shape = _input_shape(onnx, other, None, source, batch)
            entry = net.add_input(other_shape, _unique(other.name, "input", net))
            self.values[other.name] = _entry(b, entry, other_shape)
        self.refused: list[str] = []
        pattern = _Pattern(onnx, graph, b.readers)
        self.fused, self.skipped = _gelus(pattern)
        self.norms, inside = _layer_norms(onnx, pattern)
        self.skipped |= inside

    def version(self, op: str) -> int:
        """The version (since_version) of ``op`` at the model's opset; -1 for an op ONNX does not know."""
        try:
            return int(self.onnx.defs.get_schema(op, self.opset, "").since_version)
        except Exception:  # noqa: BLE001 - an op ONNX's own schemas do not know
            return -1

    def convert(self, at: int, node: Any) -> None:
        """Node ``at`` of the model's graph: its outputs' values (layers' tensors or constants), or a refusal
        kept for :meth:`finish` (its outputs then refused too, so that nothing downstream is named again)."""
        if at in self.skipped:  # a part of a GELU or a layer norm: the pattern's last node makes it
            return
        values = self.values
        ins = [values.get(n) if n else None for n in node.input]
        if at in self.fused:  # GELU's last op: one layer of GELU's input
            ins = [values.get(self.fused[at])]
        if at in self.norms:  # a layer norm's last op: x, eps, the weight and the bias
            ins = [values.get(n) for n in self.norms[at]]
        where = f"node {node.name or node.output[0]!r} ({node.op_type} v{self.version(node.op_type)})"
        if any(v is _REFUSED for v in ins):  # downstream of a refused node: that node is named already
            values.update((n, _REFUSED) for n in node.output if n)
            return
        try:
            outs = self._outputs(at, node, ins)
        except _Refuse as exc:
            self.refused.append(f"{where}: {exc}")
            values.update((n, _REFUSED) for n in node.output if n)
            return
        for i, out_name in enumerate(node.output):
            if out_name:
                values[out_name] = outs[i] if i < len(outs) else _Unusable(f"an output of {where} not imported")

    def _outputs(self, at: int, node: Any, ins: list[Any]) -> list[Any]:
        """What node ``at`` computes from its inputs' values ``ins``; raises _Refuse."""
        b = self.builder
        missing = [n for n, v in zip(node.input, ins) if n and v is None]
        if node.domain not in ("", "ai.onnx"):
            raise _Refuse(f"the custom domain {node.domain!r} is not supported")
        if missing:
            raise _Refuse(f"reads {missing[0]!r}, which no earlier node computes")
        unusable = [v.reason for v in ins if isinstance(v, _Unusable)]
        if unusable:
            raise _Refuse(f"reads {unusable[0]}")
        attrs = _attrs(self.onnx, node)
        b.start(node)
        if at in self.fused:
            x = b.tensor(ins, 0, "input (GELU's)", chw=True, view=True)
            return [b.add(nn.GELU(), [x], chw=x.chw, lifted=x.lifted)]
        if at in self.norms:  # as the LayerNormalization it is written out from
            x_name, eps, weight, bias = self.norms[at]
            b.input_names = [x_name, weight, bias]
            epsilon = float(np.asarray(b.const(ins, 1, "epsilon")).reshape(-1)[0])
            layer_norm = _CONVERTERS["LayerNormalization"].fn
            return layer_norm(b, [ins[0], ins[2], ins[3]], {"axis": -1, "epsilon": epsilon})[:1]
        if node.op_type == "Shape" and isinstance(ins[0], (_Tensor, _Mask)):
            return [_shape_of(ins[0].x if isinstance(ins[0], _Mask) else ins[0], attrs)]
        if all(isinstance(v, np.ndarray) or v is None for v in ins):
            return self._constant(node, ins, attrs)
        converter = _CONVERTERS.get(node.op_type)
        if converter is None:
            raise _Refuse("not supported")
        version = self.version(node.op_type)
        if version not in converter.versions:
            raise _Refuse(
                f"op version {version} (the model's opset {self.opset}) is not one vmem converts (versions "
                f"{', '.join(map(str, converter.versions))})"
            )
        return converter.fn(b, ins, attrs)

    def _constant(self, node: Any, ins: list[Any], attrs: dict[str, Any]) -> list[np.ndarray]:
        """A node whose inputs are all constants, computed at import; where it reads an initializer, what its
        output is of it (the same values, rows of it, copies of it, rows of a table at fixed positions), so
        that a weight made from it names its source."""
        b = self.builder
        outs = _fold(self.onnx, node, ins, self.opset, _MOST_FOLDED_TOTAL - b.folded)
        b.folded += sum(int(getattr(v, "nbytes", 0)) for v in outs)
        first = node.input[0] if node.input else ""
        known = first in self.initializers or first in b.origin
        if node.op_type in _SAME_VALUES and known:
            b.origin[node.output[0]] = b.origin.get(first, first)
        if node.op_type in ("Slice", "Split") and first in self.initializers:  # rows of a packed weight
            b.origin.update(_row_parts(node, ins, attrs, outs))
        if node.op_type in ("Expand", "Tile") and known:
            b.tiled[node.output[0]] = b.origin.get(first, first)
        table = bool(ins) and isinstance(ins[0], np.ndarray) and ins[0].ndim == 2
        if node.op_type == "Gather" and known and int(attrs.get("axis", 0)) == 0 and table:
            # rows of a table at fixed positions (a position embedding): may become trainable
            b.gathered[node.output[0]] = (b.origin.get(first, first), np.asarray(ins[1]), len(ins[0]))
        same = node.op_type in ("Cast", "Identity") and np.asarray(ins[0]).dtype == np.asarray(outs[0]).dtype
        if same and first in b.gathered:  # GPT-2's position rows cast to the type they are already
            b.gathered[node.output[0]] = b.gathered[first]
        return outs

    def finish(self) -> Graph:
        """The network: every node that cannot be imported named, or the output made (the batch first, as vmem
        stores it) and the weights loaded."""
        source, opset, graph, b, net = self.source, self.opset, self.graph, self.builder, self.net
        if self.refused:
            raise OnnxError(
                f"{source} (opset {opset}): {len(self.refused)} node(s) cannot be imported:\n  "
                + "\n  ".join(self.refused[:20])
                + (f"\n  ... and {len(self.refused) - 20} more" if len(self.refused) > 20 else "")
                + f"\nOps vmem converts: {', '.join(supported())}; any op whose inputs are all constants is "
                "evaluated at import."
            )
        out = self.values.get(graph.output[0].name)
        if not isinstance(out, _Tensor):
            raise OnnxError(f"{source}: its output {graph.output[0].name!r} is not computed from its inputs")
        b.start(next((n for n in graph.node if graph.output[0].name in n.output), graph.node[-1]))
        out = self._output(out)
        net.output(out.node)
        tied = tie_heads(net, b.params)
        net.sources = {k: v for k, v in b.sources.items() if k in b.params}
        untied = [text for init, text in b.untied if init not in {b.sources.get(to) for to in tied.values()}]
        if untied:
            import warnings

            warnings.warn(
                f"{source}: {len(untied)} initializer(s) are parameters of more than one layer, each layer "
                f"given its own copy (trained apart): {'; '.join(untied[:5])}" + (" ..." if len(untied) > 5 else ""),
                stacklevel=3,
            )
        try:
            net.load_state_dict(b.params, source=source)
        except CheckpointError as exc:  # an op left unused (a dead branch) or a converter's slip: say so
            raise OnnxError(f"{source}: the imported weights do not match the network built: {exc}") from None
        return net

    def _output(self, out: _Tensor) -> _Tensor:
        """The model's output as vmem's: its batch axis first, in the model's layout."""
        b, graph = self.builder, self.graph
        if out.view is not None:  # the batch axis moved: where the model gives it first, the output as it is
            try:
                out = b.tensor([out], 0, "output")
            except _Refuse:
                last = b.node
                raise OnnxError(
                    f"{self.source} (opset {self.opset}): 1 node(s) cannot be imported:\n  node "
                    f"{last.name or last.output[0]!r} ({last.op_type} v{self.version(last.op_type)}): gives the "
                    f"network's output with {_views.where(out)} (vmem's outputs keep the batch axis first)"
                ) from None
        if out.nhwc:  # the model ends in a transposed map: made now
            out = b.add(nn.Transpose((0, 2, 3, 1)), [_Tensor(out.node, out.shape)])
        if out.lifted:  # held 5-D inside the network; the output as the model gives it (vmem stores 4-D channels-last)
            out = b.add(nn.Reshape(out.shape[2:]), [out])
        if out.node.layer is None:  # the output is an input: a layer passes it on
            out = b.add(nn.Identity(), [out], name=_unique(graph.output[0].name, "output", self.net))
        if out.chw is not None:
            raise OnnxError(
                f"{self.source}: its output is a flattened feature map, which vmem orders (H, W, C); "
                "end the model in a layer that mixes the features (Gemm, MatMul)"
            )
        return out


def tie_heads(net: Graph, params: dict[str, np.ndarray]) -> dict[str, str]:
    """Tie each linear layer's weight that holds an embedding's table, value for value, to that table
    (``Network.tie``; its copy dropped from ``params``): a language model's head tied to its embedding, which
    PyTorch trains as one parameter. The exporters write it either as one initializer that both read (the
    dynamo exporter) or as the table and its transpose apart (the TorchScript exporter's folding): both are
    found by value. A table of one value throughout (a fresh model's zeros or ones, which an exporter merges
    with any equal constant) is left apart. Returns the ties made."""
    tables: dict[bytes, str] = {}
    for layer in net.layers:
        key = f"{layer.name}.weight"
        table = params.get(key)
        if isinstance(layer, nn.Embedding) and table is not None and table.size > 1 and np.ptp(table) > 0:
            tables.setdefault(table.tobytes() + str(table.shape).encode(), key)
    tied: dict[str, str] = {}
    for layer in net.layers if tables else ():
        key = f"{layer.name}.weight"
        weight = params.get(key)
        if isinstance(layer, nn.Linear) and weight is not None and key not in tied:
            to = tables.get(weight.tobytes() + str(weight.shape).encode())
            if to is not None:
                net.tie(key, to)
                tied[key] = to
                del params[key]
    return tied


def _opset(onnx: ModuleType, proto: Any, source: str) -> int:
    """The model's version of the default ONNX domain, refused where vmem cannot read it."""
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
    return int(opset)


def _row_parts(node: Any, ins: list[Any], attrs: dict[str, Any], outs: list[np.ndarray]) -> dict[str, str]:
    """Outputs of a Slice or Split of an initializer along its first axis (a packed projection cut into its
    query and key/value weights) -> ``"name[a:b]"``, the rows they hold (``net.sources`` names such a weight
    so); nothing for other cuts."""
    name, rows = node.input[0], len(ins[0]) if np.ndim(ins[0]) else 0
    if node.op_type == "Slice":
        starts, ends = (np.asarray(v).reshape(-1) for v in ins[1:3])
        axes = np.asarray(ins[3]).reshape(-1) if len(ins) > 3 and ins[3] is not None else np.arange(len(starts))
        steps = np.asarray(ins[4]).reshape(-1) if len(ins) > 4 and ins[4] is not None else np.ones_like(starts)
        if list(axes) != [0] or int(steps[0]) != 1 or not rows:
            return {}
        start, end, _ = slice(int(starts[0]), int(ends[0])).indices(rows)
        return {node.output[0]: f"{name}[{start}:{end}]"}
    if int(attrs.get("axis", 0)) != 0 or not rows:
        return {}
    out, at = {}, 0
    for output, value in zip(node.output, outs):
        n = len(value)
        out[output] = f"{name}[{at}:{at + n}]"
        at += n
    return out


def _entry(b: _Builder, node: Node, shape: tuple[int, ...]) -> _Tensor:
    """An input of the network, of vmem shape (N, *shape): where the model has no batch axis and the input is
    3-D, held lifted (a Reshape), as vmem stores 4-D tensors as images."""
    x = _Tensor(node, (1,) + shape, lead=b.lead)
    if b.lead and len(shape) == 3:
        x = b.add(nn.Reshape((1,) + shape), [x], lifted=True, name=_unique(f"{node.name}.lifted", "input", b.graph))
    return x


def _input_shape(
    onnx: ModuleType, inp: Any, given: Sequence[int] | None, source: str, batch: bool = True
) -> tuple[int, ...]:
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
