"""The ONNX importer's converters for the products (Gemm, MatMul, batched MatMul) and what normalizes along an
axis (LayerNormalization, Softmax)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import nn

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
    _as_tensor,
    _reshaped,
    _no_batch_axis,
)

from ._convert_arith import _constant_for
from ._convert_shape import _transposed

_Views = tuple[tuple[int, ...], ...]


def _linear_weight(x: _Tensor, w: np.ndarray) -> np.ndarray:
    """A (out, in) weight in the order vmem stores the input's features (see :func:`_flat`)."""
    if x.chw is None:
        return w
    c, h, ww = x.chw
    return w.reshape(w.shape[0], c, h, ww).transpose(0, 2, 3, 1).reshape(w.shape[0], -1)


@_converts("Gemm", 9, 11, 13)
def _gemm(b: _Builder, ins: Ins, attrs: Attrs) -> Outs:
    x = b.tensor(ins, 0, "input A", chw=True, view=True)
    if len(x.dims) != 2:
        raise _Refuse(f"its input A has shape {x.dims}: Gemm multiplies matrices")
    groups = None
    if x.view is not None:  # rows that hold the batch with other axes (a sequence's positions): by row
        if int(attrs.get("transA", 0)):
            raise _Refuse("transA=1 of a tensor whose batch axis moved")
        x, groups = _rows(b, x)
    if int(attrs.get("transA", 0)):
        _no_batch_axis(b, [0], "transA=1 moves")
        x = _transposed(b, x, [1, 0])
    w = b.weight(ins, 1, "weights B", "weight")
    c = b.const(ins, 2, "bias C", optional=True)
    assert w is not None
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    w = w if int(attrs.get("transB", 0)) else w.T  # (out, in)
    out, inp = w.shape
    if inp != (x.dims[1] if groups is None else x.shape[-1]):
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
    if groups is not None:
        return [_views.run(b, layer, [x], groups, {"weight": w * alpha, "bias": bias})]
    y = b.add(layer, [x], {"weight": _linear_weight(x, w * alpha), "bias": bias})
    if matrix is not None:
        y = b.add(nn.ConstantOp("add", _constant_for(y, matrix)), [y])
    return [y]


def _rows(b: _Builder, x: _Tensor) -> tuple[_Tensor, _Views]:
    """A viewed tensor arranged so that its last axis (what a linear layer reads) is vmem's last."""
    raw, groups = _views.arrange(b, *_views.groups_of(b, x))
    _views.single(raw, groups, len(groups) - 1, "multiplies along")
    return raw, groups


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


def _batched_views(b: _Builder, a: _Tensor, m: _Tensor) -> _Tensor:
    """A batched product where the model moved the batch axis: both operands arranged in the model's order,
    their leading axes alike, the matrices in vmem's last two axes."""
    (x, gx), (y, gy) = (_views.arrange(b, *_views.groups_of(b, t)) for t in (a, m))
    rank = len(x.shape)
    if (
        len(gx) < 3
        or gx[:-2] != gy[:-2]
        or x.shape[:-2] != y.shape[:-2]
        or len(y.shape) != rank
        or gx[-2:] != ((rank - 2,), (rank - 1,))
        or gy[-2:] != ((rank - 2,), (rank - 1,))
    ):
        raise _Refuse(f"multiplies tensors of shapes {a.dims} and {m.dims} whose batch axes vmem cannot line up")
    return _views.run(b, nn.MatMul(), [x, y], gx)


@_converts("MatMul", 9, 13)
def _matmul(b: _Builder, ins: Ins, attrs: Attrs) -> Outs:
    if isinstance(ins[1], np.ndarray):  # x @ W: a linear layer without a bias
        x = b.tensor(ins, 0, "input A", chw=True, view=True)
        w = b.weight(ins, 1, "weights B", "weight")
        assert w is not None
        if x.view is not None:
            raw, groups = _rows(b, x)
            if w.ndim != 2 or raw.shape[-1] != w.shape[0]:
                raise _Refuse(f"multiplies {x.dims} by a constant {w.shape}: vmem's Linear takes a 2-D weight")
            linear = nn.Linear(int(w.shape[0]), int(w.shape[1]), bias=False)
            return [_views.run(b, linear, [raw], groups, {"weight": w.T})]
        if w.ndim not in (1, 2) or x.dims[-1] != w.shape[0] or (x.chw is not None and len(x.dims) != 2):
            raise _Refuse(f"multiplies {x.dims} by a constant {w.shape}: vmem's Linear takes a 2-D weight")
        x = _as_tensor(b, x)
        column = w.ndim == 1
        w2 = w.reshape(-1, 1) if column else w
        layer = nn.Linear(int(w2.shape[0]), int(w2.shape[1]), bias=False)
        y = b.add(layer, [x], {"weight": _linear_weight(x, w2.T)}, lifted=x.lifted)
        return [_reshaped(b, y, y.dims[:-1]) if column else y]
    a, m = b.tensor(ins, 0, "input A", view=True), b.tensor(ins, 1, "input B", view=True)
    if a.view is not None or m.view is not None:
        return [_batched_views(b, a, m)]
    a, m, out = _matrices(b, a, m)
    y = b.add(nn.MatMul(), [a, m], lifted=a.lifted)
    return [_reshaped(b, y, out)]


@_converts("LayerNormalization", 17)
def _layer_norm(b: _Builder, ins: Ins, attrs: Attrs) -> Outs:
    x = b.tensor(ins, 0, "input", view=True)
    groups = None
    if x.view is not None:
        x, groups = _rows(b, x)
    else:
        x = _as_tensor(b, x)
    scale = b.weight(ins, 1, "scale", "weight")
    bias = b.weight(ins, 2, "bias", "bias", optional=True)
    assert scale is not None
    dims = x.dims if groups is None else tuple(x.shape[g[0]] if len(g) == 1 else 0 for g in groups)
    axis = int(attrs.get("axis", -1)) % len(dims)
    if axis != len(dims) - 1 or scale.reshape(-1).shape != (dims[-1],):
        raise _Refuse(f"normalises axes {axis}.. of {x.dims}: vmem's LayerNorm normalises the last axis")
    if int(attrs.get("stash_type", 1)) != 1:
        raise _Refuse("stash_type other than float32")
    features = dims[-1]
    layer = nn.LayerNorm(features, eps=_real(attrs.get("epsilon", 1e-5)))
    params: dict[str, np.ndarray | None] = {
        "weight": scale.reshape(-1),
        "bias": np.zeros(features) if bias is None else bias.reshape(-1),
    }
    if groups is not None:
        return [_views.run(b, layer, [x], groups, params), *_stats()]
    return [b.add(layer, [x], params, lifted=x.lifted), *_stats()]


def _stats() -> list[Any]:
    unusable = _Unusable("the mean and inverse deviation LayerNormalization may also give")
    return [unusable, unusable]


@_converts("Softmax", 1, 11, 13)
def _softmax(b: _Builder, ins: Ins, attrs: Attrs) -> Outs:
    x = b.tensor(ins, 0, "input", view=True)
    x = x if x.view is not None else _as_tensor(b, x)
    rank = len(x.dims)
    default = -1 if b.opset >= 13 else 1
    axis = int(attrs.get("axis", default)) % rank
    if x.view is not None and b.opset >= 13:
        raw, groups = _views.groups_of(b, x)
        return [_views.run(b, nn.Softmax(_views.single(raw, groups, axis, "softmaxes along")), [raw], groups)]
    tail = x.dims[axis + 1 :]
    if b.opset < 13 and any(d != 1 for d in tail):  # before 13 the input was coerced to 2-D at the axis
        # (a tail of ones, as SqueezeNet's (N, 1000, 1, 1): the same softmax, along the axis)
        raise _Refuse(f"axis={axis} of a rank-{rank} input (opset {b.opset} softmaxes the flattened tail)")
    _no_batch_axis(b, [axis], "softmaxes along")
    return [b.add(nn.Softmax(x.axis(axis)), [x], lifted=x.lifted)]
