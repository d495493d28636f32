"""The ONNX exporter: a vmem network -> an ONNX model onnxruntime runs with the same outputs (see
:mod:`vmem.onnx`)."""

from __future__ import annotations

import os
from typing import Any, Callable, TYPE_CHECKING

import numpy as np

from .. import nn
from ..errors import OnnxError
from ..graph.network import Network, Node
from ..graph.program import _live_nodes
from ._builder import _onnx

if TYPE_CHECKING:
    from types import ModuleType
    from numpy.typing import DTypeLike

__all__ = ["save"]

#: The opsets :func:`save` writes (LayerNormalization needs 17; GELU is one op from 20).
OPSETS = range(13, 22)


class _Writer:
    def __init__(self, onnx: ModuleType, net: Network, opset: int, fold: bool):
        self.onnx, self.net, self.opset = onnx, net, opset
        self.nodes: list[Any] = []
        self.inits: dict[str, Any] = {}
        self.names: dict[int, str] = {0: "input"}  # vmem node index -> the ONNX value it computes
        self.names.update((node.index, node.name) for node in net.inputs[1:])  # other inputs keep their names
        self.live = _live_nodes(net)
        self.readers: dict[int, list[Any]] = {}  # vmem node index -> the layers reading it
        for node in self.live[1:]:
            for i in node.inputs:
                self.readers.setdefault(i.index, []).append(node.layer)
        #: inputs read only as integers (by embeddings: token ids; by a recurrence's steps: lengths), written as
        #: INT64 inputs
        self.int_inputs = {
            self.names[node.index]
            for node in net.inputs
            if self.readers.get(node.index)
            and all(isinstance(r, (nn.Embedding, nn.StepMask)) for r in self.readers[node.index])
        }
        self.params = net.params or {}
        self.folded: dict[int, Node] = {}  # conv node index -> the batch norm folded into it
        if fold:
            self._fold_plan()

    def _fold_plan(self) -> None:
        for node in self.live[1:]:
            src = node.inputs[0] if node.inputs else None
            if (
                isinstance(node.layer, nn.BatchNorm2d)
                and src is not None
                and isinstance(src.layer, nn.Conv2d)
                and len(self.readers.get(src.index, [])) == 1
                and src.alias is None
                and sum(1 for n in self.net._nodes[1:] if n.layer is src.layer) == 1
            ):
                self.folded[src.index] = node

    # -- helpers ------------------------------------------------------------------------------------
    def param(self, layer: nn.Layer, key: str) -> np.ndarray:
        name = f"{layer.name}.{key}"
        return np.asarray(self.params[self.net.ties.get(name, name)], np.float32)

    def init(self, name: str, value: np.ndarray) -> str:
        """The initializer ``name`` holding ``value``, made at its first use; a tied parameter's
        (``Network.tie``) is the one it is tied to."""
        name = self.net.ties.get(name, name)
        if name not in self.inits:
            array = np.asarray(value)  # (a scalar stays a scalar: ascontiguousarray would make it 1-D)
            self.inits[name] = self.onnx.numpy_helper.from_array(
                array if array.flags.c_contiguous else array.copy(), name
            )
        return name

    def const(self, name: str, value: Any, dtype: DTypeLike = np.int64) -> str:
        return self.init(name, np.asarray(value, dtype))

    def emit(self, op: str, inputs: list[str], output: str, **attrs: Any) -> str:
        self.nodes.append(self.onnx.helper.make_node(op, inputs, [output], name=output, **attrs))
        return output

    # -- layers -------------------------------------------------------------------------------------
    def layer(self, node: Node) -> str:
        layer, name = node.layer, node.name
        ins = [self.names[i.index] for i in node.inputs]
        write = _WRITERS.get(type(layer))
        if write is None:
            raise OnnxError(
                f"{self.net.name}: layer {name!r} ({type(layer).__name__}) has no ONNX form in vmem.onnx.save "
                f"(it writes {', '.join(sorted(t.__name__ for t in _WRITERS))})"
            )
        return write(self, node, layer, ins, name)


def _conv(w: _Writer, node: Node, layer: nn.Conv2d, ins: list[str], name: str) -> str:
    weight = w.param(layer, "weight").transpose(0, 3, 1, 2)  # (K, kh, kw, C) -> (K, C, kh, kw)
    bias = w.param(layer, "bias") if layer.bias else None
    out = name
    bn = w.folded.get(node.index)
    if bn is not None:  # y = gamma (conv(x) + b - mean) / sqrt(var + eps) + beta, as one convolution
        norm = bn.layer
        assert isinstance(norm, nn.BatchNorm2d)
        g = w.param(norm, "weight") / np.sqrt(w.param(norm, "running_var") + norm.eps)
        weight = weight * g[:, None, None, None]
        shift = w.param(norm, "bias") - w.param(norm, "running_mean") * g
        bias = shift if bias is None else bias * g + shift
        out = bn.name
    names = [ins[0], w.init(f"{layer.name}.weight", weight)]
    if bias is not None:
        names.append(w.init(f"{layer.name}.bias", np.asarray(bias, np.float32)))
    (ph, pw) = layer.padding
    attrs: dict[str, Any] = {"group": layer.groups} if layer.groups > 1 else {}
    if layer.dilation != (1, 1):
        attrs["dilations"] = list(layer.dilation)
    w.emit(
        "Conv",
        names,
        out,
        kernel_shape=list(layer.kernel_size),
        strides=list(layer.stride),
        pads=[ph, pw, ph, pw],
        **attrs,
    )
    if bn is not None:
        w.names[bn.index] = out
    return out


def _batchnorm(w: _Writer, node: Node, layer: nn.BatchNorm2d, ins: list[str], name: str) -> str:
    if node.index in w.names:  # folded into the convolution before it
        return w.names[node.index]
    keys = ("weight", "bias", "running_mean", "running_var")
    names = [ins[0]] + [w.init(f"{layer.name}.{k}", w.param(layer, k)) for k in keys]
    return w.emit("BatchNormalization", names, name, epsilon=layer.eps, momentum=1.0 - layer.momentum)


def _simple(op: str) -> Callable[..., str]:
    def write(w: _Writer, node: Node, layer: nn.Layer, ins: list[str], name: str) -> str:
        return w.emit(op, ins, name)

    return write


def _power(w: _Writer, node: Node, layer: nn.Power, ins: list[str], name: str) -> str:
    return w.emit("Pow", [ins[0], w.const(f"{name}.exponent", layer.exponent, np.float32)], name)


def _hardsigmoid(w: _Writer, node: Node, layer: nn.HardSigmoid, ins: list[str], name: str) -> str:
    return w.emit("HardSigmoid", ins, name, alpha=layer.alpha, beta=layer.beta)


def _hardswish(w: _Writer, node: Node, layer: nn.HardSwish, ins: list[str], name: str) -> str:
    if w.opset < 14:  # HardSwish is an op from 14: x * HardSigmoid(x) before
        gate = w.emit("HardSigmoid", ins, f"{name}.gate", alpha=1.0 / 6.0, beta=0.5)
        return w.emit("Mul", [ins[0], gate], name)
    return w.emit("HardSwish", ins, name)


def _silu(w: _Writer, node: Node, layer: nn.SiLU, ins: list[str], name: str) -> str:
    return w.emit("Mul", [ins[0], w.emit("Sigmoid", ins, f"{name}.sigmoid")], name)


def _clip(w: _Writer, node: Node, layer: nn.Clip, ins: list[str], name: str) -> str:
    lo = w.const(f"{name}.min", layer.lo, np.float32)
    hi = w.const(f"{name}.max", layer.hi, np.float32)
    return w.emit("Clip", [ins[0], lo, hi], name)


def _dropout(w: _Writer, node: Node, layer: nn.Dropout, ins: list[str], name: str) -> str:
    return w.emit("Dropout", [ins[0], w.const(f"{name}.ratio", layer.p, np.float32)], name)


def _pool(w: _Writer, node: Node, layer: nn.MaxPool2d | nn.AvgPool2d, ins: list[str], name: str) -> str:
    (ph, pw) = layer.padding
    attrs: dict[str, Any] = dict(
        kernel_shape=list(layer.kernel_size), strides=list(layer.stride), pads=[ph, pw, ph, pw]
    )
    if layer.ceil_mode:
        attrs["ceil_mode"] = 1
    if layer.dilation != (1, 1):
        if isinstance(layer, nn.AvgPool2d) and w.opset < 19:
            raise OnnxError(f"layer {name!r} (AvgPool2d): dilated windows need opset 19 or later (opset={w.opset})")
        attrs["dilations"] = list(layer.dilation)
    if isinstance(layer, nn.AvgPool2d):
        attrs["count_include_pad"] = int(layer.count_include_pad)
        return w.emit("AveragePool", ins, name, **attrs)
    return w.emit("MaxPool", ins, name, **attrs)


def _add(w: _Writer, node: Node, layer: nn.Add, ins: list[str], name: str) -> str:
    return w.emit("Add" if len(ins) == 2 else "Sum", ins, name)


def _concat(w: _Writer, node: Node, layer: nn.Concat, ins: list[str], name: str) -> str:
    return w.emit("Concat", ins, name, axis=layer.axis)


def _flatten(w: _Writer, node: Node, layer: nn.Flatten, ins: list[str], name: str) -> str:
    shape = w.net.shape_of(node.inputs[0])
    src = ins[0]
    if len(shape) == 4 and shape[2] * shape[3] > 1:  # vmem's features are ordered (H, W, C)
        src = w.emit("Transpose", [src], f"{name}.nhwc", perm=[0, 2, 3, 1])
    return w.emit("Flatten", [src], name, axis=1)


def _linear(w: _Writer, node: Node, layer: nn.Linear, ins: list[str], name: str) -> str:
    bias = [w.init(f"{layer.name}.bias", w.param(layer, "bias"))] if layer.bias else []
    if len(w.net.shape_of(node.inputs[0])) == 2:
        return w.emit("Gemm", [ins[0], w.init(f"{layer.name}.weight", w.param(layer, "weight"))] + bias, name, transB=1)
    wt = w.init(f"{layer.name}.weight_t", w.param(layer, "weight").T)  # (in, out), as MatMul reads it
    if not bias:
        return w.emit("MatMul", [ins[0], wt], name)
    return w.emit("Add", [w.emit("MatMul", [ins[0], wt], f"{name}.matmul"), bias[0]], name)


def _reshape(w: _Writer, node: Node, layer: nn.Reshape, ins: list[str], name: str) -> str:
    target = layer.target(w.net.shape_of(node.inputs[0]))  # the input's shape with its batch axis (ExpandDims)
    return w.emit("Reshape", [ins[0], w.const(f"{name}.shape", [0] + list(target))], name)


def _softmax(w: _Writer, node: Node, layer: nn.Softmax, ins: list[str], name: str) -> str:
    return w.emit("Softmax", ins, name, axis=layer.axis)


def _matmul(w: _Writer, node: Node, layer: nn.MatMul, ins: list[str], name: str) -> str:
    b = ins[1]
    if layer.transpose_b:
        rank = len(w.net.shape_of(node.inputs[1]))
        b = w.emit("Transpose", [b], f"{name}.bt", perm=list(range(rank - 2)) + [rank - 1, rank - 2])
    return w.emit("MatMul", [ins[0], b], name)


def _constant_op(w: _Writer, node: Node, layer: nn.ConstantOp, ins: list[str], name: str) -> str:
    stored = w.param(layer, "value")
    value = stored.transpose(0, 3, 1, 2) if stored.ndim == 4 else stored  # back to the logical layout
    const = w.init(f"{layer.name}.value", value)
    op = {"add": "Add", "sub": "Sub", "rsub": "Sub", "mul": "Mul", "div": "Div"}[layer.op]
    return w.emit(op, [const, ins[0]] if layer.op == "rsub" else [ins[0], const], name)


def _tokens(w: _Writer, node: Node, layer: nn.Tokens, ins: list[str], name: str) -> str:
    """The tokens expanded to the input's batch (its shape's first value), then joined."""
    value = w.init(f"{layer.name}.value", w.param(layer, "value"))
    batch = w.emit("Shape", [ins[0]], f"{name}.shape", start=0, end=1) if w.opset >= 15 else None
    if batch is None:
        whole = w.emit("Shape", [ins[0]], f"{name}.shape")
        batch = w.emit("Slice", [whole, w.const(f"{name}.zero", [0]), w.const(f"{name}.one", [1])], f"{name}.batch")
    rest = w.const(f"{name}.rest", list(layer.value.shape))
    shape = w.emit("Concat", [batch, rest], f"{name}.expanded_shape", axis=0)
    tokens = w.emit("Expand", [value, shape], f"{name}.tokens")
    parts = [tokens, ins[0]] if layer.first else [ins[0], tokens]
    return w.emit("Concat", parts, name, axis=layer.axis)


def _embedding(w: _Writer, node: Node, layer: nn.Embedding, ins: list[str], name: str) -> str:
    ids = ins[0]
    if ids not in w.int_inputs:  # ids computed in floating point (exact up to 2^24): made integers
        ids = w.emit("Cast", [ids], f"{name}.ids", to=w.onnx.TensorProto.INT64)
    return w.emit("Gather", [w.init(f"{layer.name}.weight", w.param(layer, "weight")), ids], name, axis=0)


def _split(w: _Writer, node: Node, layer: nn.Split, ins: list[str], name: str) -> str:
    shape = w.net.shape_of(node.inputs[0])
    axis = layer.axis % len(shape)
    n = shape[axis] // layer.sections
    bounds = [w.const(f"{name}.{k}", [v]) for k, v in (("starts", layer.index * n), ("ends", (layer.index + 1) * n))]
    return w.emit("Slice", [ins[0], *bounds, w.const(f"{name}.axes", [axis])], name)


def _pad(w: _Writer, node: Node, layer: nn.Pad2d, ins: list[str], name: str) -> str:
    t, left, bottom, r = layer.pads
    pads = w.const(f"{name}.pads", [0, 0, t, left, 0, 0, bottom, r])
    value = w.const(f"{name}.value", layer.value, np.float32)
    return w.emit("Pad", [ins[0], pads, value], name, mode="constant")


def _transpose(w: _Writer, node: Node, layer: nn.Transpose, ins: list[str], name: str) -> str:
    return w.emit("Transpose", ins, name, perm=list(layer.perm))


def _gelu(w: _Writer, node: Node, layer: nn.GELU, ins: list[str], name: str) -> str:
    if w.opset >= 20:
        return w.emit("Gelu", ins, name, **({"approximate": "tanh"} if layer.approximate == "tanh" else {}))
    if layer.approximate == "tanh":
        raise OnnxError(f"layer {name!r} (GELU): the tanh form is one op from opset 20 (opset={w.opset})")
    x = ins[0]  # 0.5 x (1 + erf(x / sqrt 2)), as PyTorch's exporter writes it before opset 20
    scaled = w.emit("Div", [x, w.const(f"{name}.sqrt2", np.sqrt(2.0), np.float32)], f"{name}.scaled")
    bracket = w.emit(
        "Add", [w.emit("Erf", [scaled], f"{name}.erf"), w.const(f"{name}.one", 1.0, np.float32)], f"{name}.bracket"
    )
    product = w.emit("Mul", [x, bracket], f"{name}.product")
    return w.emit("Mul", [product, w.const(f"{name}.half", 0.5, np.float32)], name)


def _mean(w: _Writer, node: Node, layer: nn.Mean, ins: list[str], name: str) -> str:
    rank = len(w.net.shape_of(node.inputs[0]))
    axes = sorted(a % rank for a in layer.axes)
    if w.opset < 18:
        return w.emit("ReduceMean", ins, name, axes=axes, keepdims=1)
    return w.emit("ReduceMean", [ins[0], w.const(f"{name}.axes", axes)], name, keepdims=1)


def _take(w: _Writer, node: Node, layer: nn.Take, ins: list[str], name: str) -> str:
    rank = len(w.net.shape_of(node.inputs[0]))
    return w.emit("Gather", [ins[0], w.const(f"{name}.indices", list(layer.indices))], name, axis=layer.axis % rank)


def _layernorm(w: _Writer, node: Node, layer: nn.LayerNorm, ins: list[str], name: str) -> str:
    if w.opset < 17:
        raise OnnxError(f"layer {name!r} (LayerNorm): LayerNormalization needs opset 17 or later (opset={w.opset})")
    names = [ins[0], w.init(f"{layer.name}.weight", w.param(layer, "weight"))]
    names.append(w.init(f"{layer.name}.bias", w.param(layer, "bias")))
    return w.emit("LayerNormalization", names, name, axis=-1, epsilon=layer.eps)


def _select(w: _Writer, node: Node, layer: nn.Select, ins: list[str], name: str) -> str:
    op = {">": "Greater", "<": "Less", ">=": "GreaterOrEqual", "<=": "LessOrEqual", "==": "Equal", "!=": "Equal"}
    if layer.cmp in ("isnan", "notnan"):
        test = w.emit("IsNaN", [ins[0]], f"{name}.test")
    else:
        threshold = w.const(f"{name}.threshold", layer.threshold, np.float32)
        test = w.emit(op[layer.cmp], [ins[0], threshold], f"{name}.test")
    if layer.cmp in ("!=", "notnan"):
        test = w.emit("Not", [test], f"{name}.not")
    values = [  # None: the input itself (a bound written out, attention's NaN-to-zero)
        ins[0] if v is None else w.const(f"{name}.{k}", v, np.float32)
        for k, v in (("if_true", layer.if_true), ("if_false", layer.if_false))
    ]
    return w.emit("Where", [test, *values], name)


def _stepmask(w: _Writer, node: Node, layer: nn.StepMask, ins: list[str], name: str) -> str:
    lengths = ins[2]
    if lengths not in w.int_inputs:  # lengths computed in floating point: made integers
        lengths = w.emit("Cast", [lengths], f"{name}.lengths", to=w.onnx.TensorProto.INT64)
    on = w.emit("Greater", [lengths, w.const(f"{name}.t", layer.t)], f"{name}.on")  # (N,): the step runs
    rank = len(w.net.shape_of(node.inputs[0]))
    on = w.emit("Reshape", [on, w.const(f"{name}.shape", [-1] + [1] * (rank - 1))], f"{name}.mask")
    return w.emit("Where", [on, ins[0], ins[1]], name)


def _expand(w: _Writer, node: Node, layer: nn.Expand, ins: list[str], name: str) -> str:
    return w.emit("Expand", [ins[0], w.const(f"{name}.shape", [1, *layer.shape])], name)


_WRITERS: dict[type, Callable[..., str]] = {
    nn.Conv2d: _conv,
    nn.BatchNorm2d: _batchnorm,
    nn.ReLU: _simple("Relu"),
    nn.Sigmoid: _simple("Sigmoid"),
    nn.Tanh: _simple("Tanh"),
    nn.HardSigmoid: _hardsigmoid,
    nn.HardSwish: _hardswish,
    nn.SiLU: _silu,
    nn.Erf: _simple("Erf"),
    nn.Power: _power,
    nn.Mul: _simple("Mul"),
    nn.Sub: _simple("Sub"),
    nn.Div: _simple("Div"),
    nn.ConstantOp: _constant_op,
    nn.Clip: _clip,
    nn.Dropout: _dropout,
    nn.MaxPool2d: _pool,
    nn.AvgPool2d: _pool,
    nn.Add: _add,
    nn.Concat: _concat,
    nn.Tokens: _tokens,
    nn.Flatten: _flatten,
    nn.Linear: _linear,
    nn.Reshape: _reshape,
    nn.ExpandDims: _reshape,
    nn.Softmax: _softmax,
    nn.MatMul: _matmul,
    nn.Transpose: _transpose,
    nn.Pad2d: _pad,
    nn.Embedding: _embedding,
    nn.Split: _split,
    nn.LayerNorm: _layernorm,
    nn.Identity: _simple("Identity"),
    nn.GELU: _gelu,
    nn.Mean: _mean,
    nn.Take: _take,
    nn.Select: _select,
    nn.Expand: _expand,
    nn.StepMask: _stepmask,
}


def save(net: Network, path: str | os.PathLike, *, opset: int = 17, fold_batch_norm: bool = False) -> None:
    """Write ``net`` with its weights (``net.params``: after training, :meth:`vmem.Trainer.sync` copies
    them there) as an ONNX model at ``opset`` (13 to 21), its input ``input`` of shape (N, *input_shape)
    with N symbolic (other inputs under their names), its output ``output``.

    Batch norm is written as an inference-mode BatchNormalization (its running statistics, and its momentum
    in ONNX's sense), or with ``fold_batch_norm`` folded into the convolution it follows where that
    convolution feeds nothing else. The file is replaced atomically: a failed save leaves the last good file,
    and nothing but a regular file is overwritten. Raises OnnxError naming a layer with no ONNX form, before
    anything is written."""
    onnx = _onnx()
    from ..training import checkpoint

    if opset not in OPSETS:
        raise OnnxError(f"opset={opset!r}: vmem.onnx.save writes opsets {OPSETS.start} to {OPSETS.stop - 1}")
    if net.params is None:
        raise OnnxError(f"{net.name}: its parameters are not initialized; call net.init(seed) or train it first")
    if net.input_shape is None:
        raise OnnxError(f"{net.name}: no input shape; build it with input_shape=(C, H, W)")
    real = checkpoint.target(path, "an ONNX model", "model.onnx", OnnxError)
    w = _Writer(onnx, net, opset, fold_batch_norm)
    live = w.live
    for node in live[1:]:
        if node.layer is not None:  # (another input: named already)
            w.names[node.index] = w.layer(node)
    last = w.names[live[-1].index] if len(live) > 1 else "input"
    w.emit("Identity", [last], "output")
    helper = onnx.helper
    out_shape = net.output_shape(1)
    graph = helper.make_graph(
        w.nodes,
        net.name,
        [
            helper.make_tensor_value_info(
                w.names[node.index],
                onnx.TensorProto.INT64 if w.names[node.index] in w.int_inputs else onnx.TensorProto.FLOAT,
                ["N", *shape],
            )
            for node, shape in zip(net.inputs, net.input_shapes())
        ],
        [helper.make_tensor_value_info("output", onnx.TensorProto.FLOAT, ["N", *out_shape[1:]])],
        list(w.inits.values()),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="vmem")
    model.ir_version = min(model.ir_version, 8 if opset < 19 else 9)  # what onnxruntime's of the opset read
    onnx.checker.check_model(model, full_check=True)
    data = model.SerializeToString()

    def fill(f: Any) -> None:
        f.write(data)

    checkpoint.replace(real, path, fill, OnnxError, "ONNX model")
