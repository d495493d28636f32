"""The ONNX importer's converters for tensors: arithmetic (with constants folded into the layers they feed),
sums, joins, shape ops, the products (Gemm, MatMul), Gather, LayerNormalization, Softmax and the identities."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .. import nn

from ._builder import (
    BATCH,
    _onnx,
    _Refuse,
    _Tensor,
    _Unusable,
    _converts,
    _Builder,
    _real,
    _ints,
    _as_tensor,
    _reshaped,
    _no_batch_axis,
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


def _position_table(b: _Builder, at: int) -> tuple[str, bool] | None:
    """Where the constant added (input ``at``) is the first rows of a table, in order (a learned position
    embedding read at positions 0..T-1): (the table, whether it is the whole table). Added as a trainable
    constant, the table trains as the model trains it (rows past T get no gradient in either)."""
    gathered = b.gathered.get(b.input_names[at])
    if gathered is None:
        return None
    source, positions, rows = gathered
    flat = positions.reshape(-1)
    if positions.dtype.kind not in "iu" or not np.array_equal(flat, np.arange(flat.size)) or source in b.owner:
        return None
    return source, flat.size == rows


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
        table = _position_table(b, at) if kind == "add" else None
        try:
            layer = nn.ConstantOp(kind, _constant_for(x, value), trainable=table is not None)
        except ValueError as exc:
            raise _Refuse(str(exc)) from None
        if table is not None and table[1]:  # the whole table: the parameter it is (net.sources)
            b._taken.append(("value", table[0]))
        out = b.add(layer, [x], chw=x.chw, lifted=x.lifted)
        if table is not None:
            b.owner.setdefault(table[0], str(out.node.name))
        return [out]

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
    tail = x.dims[axis + 1 :]
    if b.opset < 13 and any(d != 1 for d in tail):  # before 13 the input was coerced to 2-D at the axis
        # (a tail of ones, as SqueezeNet's (N, 1000, 1, 1): the same softmax, along the axis)
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
