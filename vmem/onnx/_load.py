"""The ONNX importer: an ONNX model -> a trainable :class:`vmem.Graph` with the model's weights (see
:mod:`vmem.onnx`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import ModuleType

import math
import os
import re
from typing import Any, Sequence

import numpy as np

from .. import nn
from ..errors import CheckpointError, OnnxError
from ..graph import Graph
from ..graph.network import Node
from . import _data
from ..units import format_bytes

from . import _convert_image, _convert_tensor  # noqa: F401  (they register the converters)
from ._builder import (
    MIN_OPSET,
    BATCH,
    _SAME_VALUES,
    _MOST_FOLDED,
    _onnx,
    _Refuse,
    _Tensor,
    _Unusable,
    _REFUSED,
    _CONVERTERS,
    supported,
    _Builder,
    _unique,
)

__all__ = ["load", "supported", "MIN_OPSET"]


# -- ops exporters write out, fused back into one layer -----------------------------------------------------
class _Pattern:
    """The model's graph as the fusions read it: its nodes, which node makes each value, how many read it, and
    its small constants (at most 16 values: scales, epsilons, axes), each made into an array once."""

    def __init__(self, onnx: ModuleType, graph: Any, readers: dict[str, int]):
        self.nodes, self.readers = list(graph.node), readers
        self.index = {out: i for i, node in enumerate(self.nodes) for out in node.output}
        self.consts: dict[str, np.ndarray] = {}
        for t in graph.initializer:
            if int(np.prod(t.dims)) <= 16:
                self.consts[t.name] = onnx.numpy_helper.to_array(t)
        for node in self.nodes:
            if node.op_type == "Constant" and node.attribute:
                v = onnx.helper.get_attribute_value(node.attribute[0])
                v = onnx.numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else np.asarray(v)
                if v.size <= 16 and v.dtype.kind in "fiu":
                    self.consts[node.output[0]] = v

    def near(self, name: str, want: float) -> bool:
        """Whether ``name`` is a constant of one value within 1e-4 of ``want``."""
        v = self.consts.get(name)
        return v is not None and v.size == 1 and abs(float(v.reshape(-1)[0]) - want) <= 1e-4 * abs(want)

    def only(self, name: str) -> bool:
        """Read by one node (and not the model's output)."""
        return self.readers.get(name, 0) == 1

    def made(self, name: str, op: str) -> int | None:
        """The index of the ``op`` node that makes ``name``, if an ``op`` makes it."""
        i = self.index.get(name)
        return i if i is not None and self.nodes[i].op_type == op else None

    def reader(self, name: str, op: str | None = None) -> int | None:
        """The index of the one node (an ``op``, where given) that reads ``name``, where nothing else does."""
        hits = [i for i, n in enumerate(self.nodes) if (op is None or n.op_type == op) and name in n.input]
        return hits[0] if len(hits) == 1 and self.only(name) else None


def _other(node: Any, name: str) -> str | None:
    """The operand of a binary ``node`` beside ``name``."""
    ins = list(node.input)
    return ins[1 - ins.index(name)] if len(ins) == 2 and name in ins else None


def _gelus(g: _Pattern) -> tuple[dict[int, str], set[int]]:
    """GELU written out as ops, ``0.5 x (1 + erf(x / sqrt 2))`` in the orders exporters write it (the scale
    last, first, or on the bracket; ``x / sqrt 2`` as a Div or a Mul), each op's result read by the next
    alone: {the last node's index: x's name}, and the indices of the pattern's other nodes (not imported:
    the last becomes one :class:`vmem.nn.GELU`)."""
    nodes, near, reader = g.nodes, g.near, g.reader
    fused: dict[int, str] = {}
    skipped: set[int] = set()
    for e, erf in enumerate(nodes):
        if erf.op_type != "Erf" or not g.only(erf.input[0]):
            continue
        scaled = g.index.get(erf.input[0])
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
        if x is None or x in g.consts or add is None or not near(_other(nodes[add], erf.output[0]) or "", 1.0):
            continue
        bracket = nodes[add].output[0]
        m1 = reader(bracket, "Mul")
        if m1 is None:
            continue
        with_it = _other(nodes[m1], bracket) or ""
        half = g.made(with_it, "Mul")
        if with_it == x:  # x (1 + erf) then 0.5
            m2 = reader(nodes[m1].output[0], "Mul")
            if m2 is None or not near(_other(nodes[m2], nodes[m1].output[0]) or "", 0.5):
                continue
            last, inner = m2, [scaled, e, add, m1]
        elif near(with_it, 0.5):  # 0.5 (1 + erf) then x
            m2 = reader(nodes[m1].output[0], "Mul")
            if m2 is None or _other(nodes[m2], nodes[m1].output[0]) != x:
                continue
            last, inner = m2, [scaled, e, add, m1]
        elif half is not None and g.only(with_it) and near(_other(nodes[half], x) or "", 0.5):  # (0.5 x) (1 + erf)
            last, inner = m1, [scaled, e, add, half]
        else:
            continue
        fused[last] = x
        skipped.update(inner)
    return fused, skipped


def _layer_norms(onnx: ModuleType, g: _Pattern) -> tuple[dict[int, tuple[str, ...]], set[int]]:
    """Layer norm over the last axis written out as ops (PyTorch's exports before opset 17's
    LayerNormalization): ``m = ReduceMean(x)``, ``d = x - m``, ``v = ReduceMean(d ** 2)``,
    ``y = d / Sqrt(v + eps)``, then ``y * weight + bias``, each over the last axis with its dimensions kept
    and each intermediate read only by the pattern. Returns {the last node's index: (x, eps's name, the
    weight's name, the bias's name)} and the indices of the pattern's other nodes (the last becomes one
    LayerNormalization)."""
    nodes, consts = g.nodes, g.consts

    def made(name: str, op: str) -> Any:
        i = g.made(name, op)
        return None if i is None else nodes[i]

    def last_axis(node: Any) -> bool:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        axes = list(attrs.get("axes", []))
        if len(node.input) > 1 and node.input[1]:
            axes = [int(a) for a in consts.get(node.input[1], np.array([0])).reshape(-1)]
        return axes == [-1] and int(attrs.get("keepdims", 1)) == 1

    fused: dict[int, tuple[str, ...]] = {}
    skipped: set[int] = set()
    for at, div in enumerate(nodes):
        if div.op_type != "Div" or len(div.input) != 2:
            continue
        sub, sqrt = made(div.input[0], "Sub"), made(div.input[1], "Sqrt")
        mean = made(sub.input[1], "ReduceMean") if sub is not None else None
        if sqrt is None or mean is None or mean.input[0] != sub.input[0] or not last_axis(mean):
            continue
        add = made(sqrt.input[0], "Add")
        var = made(add.input[0], "ReduceMean") if add is not None else None
        power = made(var.input[0], "Pow") if var is not None else None
        if add is None or var is None or power is None or power.input[0] != div.input[0] or not last_axis(var):
            continue
        eps = add.input[1]
        if not g.near(power.input[1], 2.0) or eps not in consts:
            continue
        mul_at = g.reader(div.output[0], "Mul")
        bias_at = g.reader(nodes[mul_at].output[0], "Add") if mul_at is not None else None
        if mul_at is None or bias_at is None:
            continue
        weight, bias = _other(nodes[mul_at], div.output[0]), _other(nodes[bias_at], nodes[mul_at].output[0])
        private = (mean.output[0], power.output[0], var.output[0], add.output[0], sqrt.output[0], div.output[0])
        if weight is None or bias is None or not all(g.only(o) for o in private) or g.readers.get(sub.output[0]) != 2:
            continue
        fused[bias_at] = (sub.input[0], eps, weight, bias)
        skipped.update(g.index[o] for o in (mean.output[0], sub.output[0], power.output[0], var.output[0]))
        skipped.update((g.index[add.output[0]], g.index[sqrt.output[0]], at, mul_at))
    return fused, skipped


# -- the walk -------------------------------------------------------------------------------------
def _attrs(onnx: ModuleType, node: Any) -> dict[str, Any]:
    out = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


def _fold(onnx: ModuleType, node: Any, ins: list[Any], opset: int) -> list[Any]:
    """Outputs of a node whose inputs are all constants, by ONNX's reference implementation."""
    from onnx.reference import ReferenceEvaluator

    if node.op_type == "Expand" and len(ins) == 2 and isinstance(ins[1], np.ndarray) and (ins[1] >= BATCH).any():
        # a constant broadcast along the batch axis (positions expanded to the batch's ids): kept with that
        # axis of length 1, which every layer reading it broadcasts
        ins = [ins[0], np.where(ins[1] >= BATCH, 1, ins[1])]
    if node.op_type in ("ConstantOfShape", "Expand", "Tile", "Range", "RandomNormalLike", "RandomUniformLike"):
        if any(isinstance(v, np.ndarray) and v.dtype.kind in "iu" and (v >= BATCH).any() for v in ins):
            raise _Refuse("makes a constant whose size depends on the batch size")
    if node.op_type == "ConstantOfShape" and ins and isinstance(ins[0], np.ndarray):  # sized before it is made
        _check_folded(int(np.prod(ins[0], dtype=np.float64)) * 4)
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
    for v in out:
        _check_folded(v.nbytes)
    return out


def _check_folded(nbytes: int) -> None:
    if nbytes > _MOST_FOLDED:
        raise _Refuse(
            f"computes a constant of {format_bytes(nbytes)} at import (at most {format_bytes(_MOST_FOLDED)}: "
            "a shape computation or a computed weight, never a feature map)"
        )


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

    pattern = _Pattern(onnx, graph, builder.readers)
    fused, skipped = _gelus(pattern)
    norms, inside = _layer_norms(onnx, pattern)
    skipped |= inside
    for at, node in enumerate(graph.node):
        if at in skipped:  # a part of a GELU or a layer norm: the pattern's last node makes it
            continue
        ins = [values.get(n) if n else None for n in node.input]
        if at in fused:  # GELU's last op: one layer of GELU's input
            ins = [values.get(fused[at])]
        if at in norms:  # a layer norm's last op: x, eps, the weight and the bias
            ins = [values.get(n) for n in norms[at]]
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
            elif at in norms:  # as the LayerNormalization it is written out from
                x_name, eps, weight, bias = norms[at]
                builder.input_names = [x_name, weight, bias]
                epsilon = float(np.asarray(builder.const(ins, 1, "epsilon")).reshape(-1)[0])
                layer_norm = _CONVERTERS["LayerNormalization"].fn
                outs = layer_norm(builder, [ins[0], ins[2], ins[3]], {"axis": -1, "epsilon": epsilon})[:1]
            elif node.op_type == "Shape" and isinstance(ins[0], _Tensor):
                outs = [_shape_of(ins[0], attrs)]
            elif all(isinstance(v, np.ndarray) or v is None for v in ins):
                outs = _fold(onnx, node, ins, opset)
                first = node.input[0] if node.input else ""
                if node.op_type in _SAME_VALUES and (first in initializers or first in builder.origin):
                    builder.origin[node.output[0]] = builder.origin.get(first, first)
                if (
                    node.op_type == "Gather"
                    and (first in initializers or first in builder.origin)
                    and int(attrs.get("axis", 0)) == 0
                    and isinstance(ins[0], np.ndarray)
                    and ins[0].ndim == 2
                ):  # rows of a table at fixed positions (a position embedding): may become trainable
                    builder.gathered[node.output[0]] = (
                        builder.origin.get(first, first),
                        np.asarray(ins[1]),
                        len(ins[0]),
                    )
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
