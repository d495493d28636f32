"""The ONNX importer's converters for element-wise arithmetic: of two computed tensors, or of one and a
constant folded into the layer it feeds (a linear layer's bias, a position table, a scale), and sums."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .. import nn

from . import _views
from ._convert_mask import expanded
from ._builder import (
    Attrs,
    Ins,
    Outs,
    _Refuse,
    _Tensor,
    _converts,
    _Builder,
    _as_tensor,
    _reshaped,
)


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
    source = b.origin.get(b.input_names[at], b.input_names[at])  # the initializer (or its rows) it holds
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


def _attention_scale(x: _Tensor, value: np.ndarray) -> np.ndarray:
    """A scalar multiplying attention's queries or keys as the exporter rounded it: the dynamo exporter
    writes ``scaled_dot_product_attention``'s default scale 1/sqrt(d) as its square root on each of q and k,
    d^(-1/4) rounded to float32. Read back as the exact value (as PyTorch computes it in float64); the same
    float32 value in a float32 network."""
    if value.size != 1 or value.dtype != np.float32:
        return value
    dims = _views.model_shape(x) if x.view is not None else list(x.dims)
    for d in dims[-2:]:  # the head size: the last axis of q, the one before the last of k transposed
        for power in (-0.25, -0.5):
            exact = float(d) ** power
            if 1 < d < 1 << 16 and np.float32(exact) == value.reshape(()):
                return np.full(value.shape, exact)
    return value


def _position_table(b: _Builder, at: int) -> tuple[str, bool] | None:
    """Where the constant added (input ``at``) is rows of a table read at fixed positions: (its source, whether
    it is the whole table). The first rows in order (a learned position embedding read at positions 0..T-1):
    the table, trained as the model trains it (rows past T get no gradient in either). One row at every
    position (BERT's token types, all zeros by default): that row, ``table[r:r+1]``, held once and broadcast,
    its gradient summed over the positions as the model's is (:func:`_one_row`)."""
    gathered = b.gathered.get(b.input_names[at])
    if gathered is None:
        return None
    source, positions, rows = gathered
    flat = positions.reshape(-1)
    if positions.dtype.kind not in "iu" or source in b.owner or not flat.size:
        return None
    if np.array_equal(flat, np.arange(flat.size)):
        return source, flat.size == rows
    if (flat == flat[0]).all() and 0 <= int(flat[0]) < rows:
        return f"{source}[{int(flat[0])}:{int(flat[0]) + 1}]", False
    return None


def _one_row(value: np.ndarray) -> np.ndarray:
    """A constant the same at every position (one row of a table, read everywhere) held once: every axis but
    the last of length 1."""
    return value.reshape(-1, value.shape[-1])[:1].reshape((1,) * (value.ndim - 1) + value.shape[-1:])


#: a constant holding a value this large is a mask (transformers fills one with float32's lowest value)
_MASKED = float(np.finfo(np.float32).max) / 2


def _one_row_everywhere(value: np.ndarray) -> bool:
    """Whether a sample's constant (positions, ..., features) repeats one row at every position: what the
    dynamo exporter folds a table read at one fixed row into (BERT's token types at their default, 0), the
    table's row then written out once per position and sample. Trained as that one row, its gradient summed
    over the positions as the model's is (an all-equal constant is a fill, never this)."""
    rows = value.reshape(-1, value.shape[-1])
    return rows.shape[0] > 1 and bool((rows == rows[:1]).all())


def _weight_like(b: _Builder, x: _Tensor, at: int, value: np.ndarray) -> bool:
    """Whether the constant operand (input ``at``) of ``x`` is a weight the model trains: one of its
    initializers (or made from one by a reshape, transpose or cast) of more than one value, all finite,
    combined with a tensor the network computed: a layer scale, a bias added after a MatMul, a per-channel
    gain. A scalar (a scale written as an initializer), a mask holding infinities or float32's lowest value
    (a causal mask as transformers writes it), a Constant node's value and what is applied to the model's
    inputs before any layer (a normalisation's mean and deviation: buffers in the model) are constants."""
    name = b.input_names[at]
    from_initializer = name in b.initializers or name in b.origin
    if not (from_initializer and value.dtype.kind == "f" and value.size > 1 and bool(np.all(np.isfinite(value)))):
        return False
    if float(np.abs(value).max()) >= _MASKED:  # a mask of the lowest float (transformers' finfo.min)
        return False
    node = x.node
    while node.layer is not None and isinstance(node.layer, nn.ConstantOp) and node.inputs:
        node = node.inputs[0]
    return node.layer is not None  # not an input of the model, nor constants applied to one


def _arith(op: str, both: Callable[[], nn.Layer] | None) -> Callable[..., list[Any]]:
    """An element-wise binary op: of two computed tensors (``both``, where vmem has the layer), or of a
    computed tensor and a constant, either way round (:class:`vmem.nn.ConstantOp`)."""
    flipped = {"add": "add", "mul": "mul", "sub": "rsub", "div": None}[op]

    def convert(b: _Builder, ins: Ins, attrs: Attrs) -> Outs:
        a, c = ins[0], ins[1]
        if isinstance(a, _Tensor) and isinstance(c, _Tensor):
            if both is None:
                raise _Refuse(f"{op} of two computed tensors is not supported yet (one operand must be a constant)")
            xs = [b.tensor(ins, i, "operand", chw=True, view=True) for i in range(2)]
            if any(x.view is not None for x in xs):
                return [_views_join(b, both(), xs, op)]
            xs = _alike(b, xs, op)
            return [b.add(both(), xs, chw=_same_order(xs), lifted=xs[0].lifted)]
        kind: str | None = op
        if isinstance(a, _Tensor):
            x, value = b.tensor(ins, 0, "operand", chw=True, view=True), np.asarray(c)
        else:
            x, value, kind = b.tensor(ins, 1, "operand", chw=True, view=True), np.asarray(a), flipped
        if kind is None:
            raise _Refuse("a constant divided by a computed tensor is not supported yet")
        if value.dtype.kind != "f":
            raise _Refuse(f"{op} of a feature map and a {value.dtype} constant")
        at = 1 if isinstance(a, _Tensor) else 0  # where the constant is
        if kind == "mul":
            value = _attention_scale(x, value)
        fused = _bias_of_linear(b, x, value, at) if kind == "add" else None
        if fused is not None:
            return [fused]
        if x.chw is not None and value.size != 1:
            raise _Refuse("a constant combined with a map flattened in (C, H, W) order (vmem stores it (H, W, C))")
        if value.size == 1 and (
            kind in ("add", "sub") and value.item() == 0 or kind in ("mul", "div") and value.item() == 1
        ):
            return [x]  # x + 0, x * 1: nothing to do
        fill = False  # a constant made for the batch, one value throughout (an additive mask's zeros)
        row = False  # one row at every position of every sample, folded (BERT's token types, dynamo's way)
        if x.view is None and not b.lead and value.ndim == len(x.dims) and value.shape[0] == b.static_batch:
            one = _views.one_sample(value, 0)  # written out once a sample of the example batch (a position
            if one is not None:  # table the exporter read at fixed positions and folded): one, for every sample
                value, fill = one, bool((one == one.reshape(-1)[0]).all())
                row = not fill and _one_row_everywhere(one)
        if x.view is not None or _grows(x, value):
            return [_views_constant(b, x, kind, value)]
        table = _position_table(b, at) if kind == "add" else None
        if row or table is not None and table[0].endswith("]"):  # one row at every position: held once
            value = _one_row(value)
        weight = table is None and not fill and _weight_like(b, x, at, value)
        try:
            layer = nn.ConstantOp(kind, _constant_for(x, value), trainable=table is not None or weight)
        except ValueError as exc:
            raise _Refuse(str(exc)) from None
        if table is not None and (table[1] or table[0].endswith("]")):  # the whole table, or its one row read
            b._taken.append(("value", table[0]))  # everywhere: the parameter it is (net.sources)
        if weight:
            name = b.input_names[at]
            b._taken.append(("value", b.origin.get(name, name)))
        out = b.add(layer, [x], chw=x.chw, lifted=x.lifted)
        if table is not None:
            b.owner.setdefault(table[0], str(out.node.name))
        return [out]

    return convert


def _views_join(b: _Builder, layer: nn.Layer, xs: list[_Tensor], op: str) -> _Tensor:
    """An element-wise op of two computed tensors, one of them seen through a view: both arranged in the
    model's order, where they are then alike."""
    (x, gx), (y, gy) = (_views.arrange(b, *_views.unit_free(*_views.groups_of(b, t))) for t in xs)
    if gx != gy or x.shape != y.shape:
        raise _Refuse(f"{op} of tensors of shapes {xs[0].dims} and {xs[1].dims} laid out apart (the batch axis moved)")
    return _views.run(b, layer, [x, y], gx)


def _grows(x: _Tensor, value: np.ndarray) -> bool:
    """Whether a constant combined with ``x`` broadcasts it to a larger shape (a causal mask added to a
    padding mask of one row)."""
    dims = x.dims
    shape = value.shape[value.ndim - len(dims) :] if value.ndim >= len(dims) else value.shape
    return any(v > d for v, d in zip(reversed(shape), reversed(dims)))


def _views_constant(b: _Builder, x: _Tensor, kind: str, value: np.ndarray) -> _Tensor:
    """A tensor combined with a constant, the constant laid out as the vmem tensor is (the tensor first
    repeated along the axes of length 1 the constant broadcasts it along)."""
    raw, groups = _views.groups_of(b, x)
    if _grows(x, value):
        dims = list(x.dims)
        shape = [1] * (len(dims) - value.ndim) + list(value.shape)
        grown = expanded(b, raw, groups, [max(d, v) for d, v in zip(dims, shape)])
        raw, groups = _views.groups_of(b, grown)
    laid = _views.constant(raw, groups, value)
    if laid is None:  # it varies along an axis that merges several: arranged, each is one
        raw, groups = _views.arrange(b, raw, groups)
        laid = _views.constant(raw, groups, value)
    if laid is None:
        raise _Refuse(f"a constant of shape {value.shape} varies along the batch axis of {x.dims}")
    try:
        layer = nn.ConstantOp(kind, laid)
    except ValueError as exc:
        raise _Refuse(str(exc)) from None
    return _views.run(b, layer, [raw], groups)


_converts("Add", 7, 13, 14)(_arith("add", nn.Add))


_converts("Sub", 7, 13, 14)(_arith("sub", nn.Sub))


_converts("Mul", 7, 13, 14)(_arith("mul", nn.Mul))


_converts("Div", 7, 13, 14)(_arith("div", nn.Div))


@_converts("Sum", 6, 8, 13)
def _sum(b: _Builder, ins: Ins, attrs: Attrs) -> Outs:
    xs = [b.tensor(ins, i, "operand", chw=True) for i in range(len(ins))]
    if len(xs) == 1:
        return [xs[0]]
    xs = _alike(b, xs, "adds")
    return [b.add(nn.Add(), xs, chw=_same_order(xs), lifted=xs[0].lifted)]
