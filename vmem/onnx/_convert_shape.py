"""The ONNX importer's converters that move values about: joins, reshapes (flatten, squeeze, unsqueeze),
transposes, gathers and takes along an axis, and the identities (Identity, Dropout, Cast)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .. import nn

from . import _views
from ._builder import (
    Attrs,
    Ins,
    Outs,
    BATCH,
    _onnx,
    _Refuse,
    _Mask,
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


@_converts("Concat", 4, 11, 13)
def _concat(b: _Builder, ins: Ins, attrs: Attrs) -> Outs:
    if any(isinstance(v, np.ndarray) for v in ins) and not all(isinstance(v, np.ndarray) for v in ins):
        return [_tokens(b, ins, int(attrs["axis"]))]
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


def _tokens(b: _Builder, ins: Ins, axis: int) -> _Tensor:
    """A computed sequence joined with constants the same for every sample (ViT's class token, DeiT's class
    and distillation tokens, each expanded to the batch: by Expand, or baked at the exporter's batch): one
    :class:`vmem.nn.Tokens` layer per constant, each trained where the constant is one of the model's
    initializers (or that initializer expanded)."""
    computed = [i for i, v in enumerate(ins) if not isinstance(v, np.ndarray)]
    if len(computed) != 1:
        raise _Refuse("joins constants with more than one computed tensor")
    at = computed[0]
    y = _as_tensor(b, b.tensor(ins, at, "input"))
    rank = len(y.dims)
    a = axis % rank
    _no_batch_axis(b, [a], "concatenates along")
    if y.hidden or b.lead:
        raise _Refuse("joins a constant to a tensor held with axes the model does not see")
    for i in [*reversed(range(at)), *range(at + 1, len(ins))]:
        c = np.asarray(ins[i])
        if c.dtype.kind != "f" or c.ndim != rank or not np.array_equal(c, np.broadcast_to(c[:1], c.shape)):
            raise _Refuse(f"its input {i} is a constant that is not one block of tokens for every sample")
        name = b.input_names[i]
        source = b.origin.get(name) or b.tiled.get(name) or (name if name in b.initializers else None)
        trainable = source is not None and bool(np.all(np.isfinite(c)))
        if trainable and source is not None:
            b._taken.append(("value", source))
        y = b.add(nn.Tokens(c[0], axis=a, first=i < at, trainable=trainable), [y])
    return y


@_converts("Flatten", 9, 11, 13, 21, 23, 24, 25)
def _flatten(b: _Builder, ins: Ins, attrs: Attrs) -> Outs:
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
def _reshape(b: _Builder, ins: Ins, attrs: Attrs) -> Outs:
    x = b.tensor(ins, 0, "data", nhwc=True, view=True)
    target = b.const(ins, 1, "shape")
    assert target is not None
    dims = [int(d) for d in target.reshape(-1)]
    allowzero = bool(int(attrs.get("allowzero", 0)))
    if allowzero and 0 in dims:
        raise _Refuse("allowzero=1 with a 0 in the shape (an empty tensor)")
    if x.view is not None:
        return [_views.reshape(b, *_views.groups_of(b, x), dims)]
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
    if (not batch_kept or any(d >= BATCH for d in rest)) and not x.nhwc and x.chw is None:
        return [_views.reshape(b, *_views.groups_of(b, x), dims)]  # the batch moved, or merged with others
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
def _unsqueeze(b: _Builder, ins: Ins, attrs: Attrs) -> Outs:
    x = b.tensor(ins, 0, "data", view=True)
    given = _ints(attrs, "axes", []) if b.opset < 13 else [int(a) for a in b.const(ins, 1, "axes").reshape(-1)]  # type: ignore[union-attr]
    rank = len(x.dims) + len(given)
    axes = sorted(a % rank for a in given)
    if x.view is not None or (0 in axes and not b.lead):  # the batch axis moves one on
        raw, groups = _views.groups_of(b, x)
        shape = _views.model_shape(raw, groups)
        for a in axes:
            shape.insert(a, 1)
        return [_views.reshape(b, raw, groups, shape)]
    _no_batch_axis(b, axes, "inserts an axis before")
    dims = list(x.dims)
    for a in axes:
        dims.insert(a, 1)
    return [_reshaped(b, x, dims)]


@_converts("Squeeze", 1, 11, 13, 21, 23, 24, 25)
def _squeeze(b: _Builder, ins: Ins, attrs: Attrs) -> Outs:
    x = b.tensor(ins, 0, "data", view=True)
    if b.opset < 13:
        given = _ints(attrs, "axes", [])
    else:
        axes_given = b.const(ins, 1, "axes", optional=True)
        given = [] if axes_given is None else [int(a) for a in axes_given.reshape(-1)]
    rank = len(x.dims)
    if x.view is not None:
        shape = _views.model_shape(x)
        axes = sorted(int(a) % rank for a in given) or [a for a in range(rank) if shape[a] == 1]
        if any(shape[a] != 1 for a in axes):
            raise _Refuse(f"squeezes axes {axes} of {x.dims}: an axis longer than 1")
        return [_views.reshape(b, *_views.groups_of(b, x), [d for a, d in enumerate(shape) if a not in axes])]
    first = 0 if b.lead else 1
    axes = sorted(int(a) % rank for a in given) or [a for a in range(first, rank) if x.dims[a] == 1]
    _no_batch_axis(b, axes, "squeezes")
    if any(x.dims[a] != 1 for a in axes):
        raise _Refuse(f"squeezes axes {axes} of {x.dims}: an axis longer than 1")
    return [_reshaped(b, x, [d for a, d in enumerate(x.dims) if a not in axes])]


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


@_converts("Gather", 1, 11, 13)
def _gather(b: _Builder, ins: Ins, attrs: Attrs) -> Outs:
    """Rows of a constant table at computed indices (token ids): an embedding, its table trainable. Or
    positions of a computed tensor at constant indices along a non-batch axis (``x[:, 0]``, a classifier's
    first token: a Split; several: a Take)."""
    if isinstance(ins[0], _Tensor):
        return [_select(b, ins, attrs)]
    table = b.weight(ins, 0, "table", "weight")
    ids = b.tensor(ins, 1, "indices", view=True)
    assert table is not None
    if int(attrs.get("axis", 0)) != 0 or table.ndim != 2:
        raise _Refuse(f"gathers axis {attrs.get('axis', 0)} of a {table.ndim}-D constant: vmem's embedding takes rows")
    layer = nn.Embedding(int(table.shape[0]), int(table.shape[1]))
    if ids.view is not None:  # the vectors on a new last axis
        return [_views.run(b, layer, [ids], ids.view + ((len(ids.shape),),), {"weight": table})]
    return [b.add(layer, [ids], {"weight": table})]


def _select(b: _Builder, ins: Ins, attrs: Attrs) -> _Tensor:
    x = b.tensor(ins, 0, "data", view=True)
    x = x if x.view is not None else _as_tensor(b, x)
    index = b.const(ins, 1, "indices")
    assert index is not None
    if index.dtype.kind not in "iu":
        raise _Refuse(f"indices of type {index.dtype}")
    axis = int(attrs.get("axis", 0)) % len(x.dims)
    strided = _strided(b, x, index) if axis == 0 and len(x.dims) == 1 else None
    if strided is not None:  # PyTorch's as_strided over a flattened tensor: a reshape, then a transpose
        shape, perm = strided
        y = _reshape(b, [x, np.asarray(shape, np.int64)], {})[0]
        return _transpose(b, [y], {"perm": list(perm)})[0]
    if x.view is not None:
        return _select_view(b, x, index, axis)
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


def _strided(b: _Builder, x: _Tensor, index: np.ndarray) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """``(shape, perm)`` where gathering the 1-D ``x`` at ``index`` is reshaping it to ``shape`` and permuting
    the axes by ``perm`` (``index`` is ``arange(size).reshape(shape).transpose(perm)``: the dynamo exporter
    writes ``Tensor.as_strided`` with a tensor's own strides, permuted, so), every value read once; None
    otherwise. The length of ``x`` holds the batch where the model's does (an export at a fixed batch writes
    its example batch in ``index``'s shape: the reshape reads it as the batch)."""
    n, rank = index.size, index.ndim
    length = _views.model_shape(x)[0] if x.view is not None else x.dims[0]
    batch = length // BATCH if length >= BATCH else None
    if not 1 < rank <= 5 or (n != length and (batch is None or n != batch * b.static_batch)):
        return None
    import itertools

    flat = np.arange(n, dtype=index.dtype)
    for perm in itertools.permutations(range(rank)):
        shape = tuple(index.shape[perm.index(k)] for k in range(rank))  # index.shape == shape permuted by perm
        if np.array_equal(flat.reshape(shape).transpose(perm), index):
            return shape, perm
    return None


def _select_view(b: _Builder, x: _Tensor, index: np.ndarray, axis: int) -> _Tensor:
    """Positions of a viewed tensor along one of its axes (one vmem axis, not the batch's)."""
    raw, groups = _views.groups_of(b, x)
    at_axis = _views.single(raw, groups, axis, "gathers along")
    length = raw.shape[at_axis]
    if index.ndim > 1 or index.size == 0 or (index < -length).any() or (index >= length).any():
        raise _Refuse(f"indices {index.reshape(-1).tolist()} for axis {axis} of {x.dims}")
    at = [int(i) % length for i in index.reshape(-1)]
    if index.ndim == 0:  # the axis dropped: vmem keeps it, of length 1, unnamed
        return _views.run(b, nn.Split(length, at[0], at_axis), [raw], groups[:axis] + groups[axis + 1 :])
    return _views.run(b, nn.Take(at, at_axis), [raw], groups)


@_converts("Identity", 1, 13, 14, 16, 19, 21, 23, 24, 25)
def _identity(b: _Builder, ins: Ins, attrs: Attrs) -> Outs:
    return [b.tensor(ins, 0, "input", chw=True, nhwc=True, view=True)]


@_converts("Dropout", 7, 10, 12, 13, 22)
def _dropout(b: _Builder, ins: Ins, attrs: Attrs) -> Outs:
    x = b.tensor(ins, 0, "input", chw=True, view=True)
    if b.opset < 12:
        ratio = _real(attrs.get("ratio", 0.5))
    else:
        given = b.const(ins, 1, "ratio", optional=True)
        ratio = 0.5 if given is None else _real(given)
    mask = _Unusable("dropout's mask")
    if ratio == 0:
        return [x, mask]
    return [b.add(nn.Dropout(ratio), [x], chw=x.chw, lifted=x.lifted), mask]


@_converts("Transpose", 1, 13, 21, 23, 24, 25)
def _transpose(b: _Builder, ins: Ins, attrs: Attrs) -> Outs:
    x = b.tensor(ins, 0, "input", view=True)
    perm = _ints(attrs, "perm", list(range(len(x.dims)))[::-1])
    if x.view is not None or (not b.lead and perm[0] % len(x.dims) != 0 and not x.nhwc and x.chw is None):
        raw, groups = _views.groups_of(b, x)  # the batch axis moved: a new view, nothing copied
        return [_views.viewed(raw, tuple(groups[int(p) % len(groups)] for p in perm))]
    if x.image and perm == [0, 2, 3, 1]:
        return [_Tensor(x.node, x.shape, None, True)]  # read only by a flatten, in vmem's own order
    return [_transposed(b, x, perm)]


@_converts("Cast", 6, 9, 13, 19, 21, 23, 24, 25, 28)
def _cast(b: _Builder, ins: Ins, attrs: Attrs) -> Outs:
    onnx = _onnx()
    to = int(attrs["to"])
    if isinstance(ins[0], _Mask) and to == onnx.TensorProto.BOOL:  # a comparison, as it is
        return [ins[0]]
    if to != onnx.TensorProto.FLOAT:
        raise _Refuse(
            f"casts a feature map to {onnx.TensorProto.DataType.Name(to).lower()}: vmem's feature maps are float32 "
            "(or the half precision a Trainer's precision= asks for), not the model's choice"
        )
    return [b.tensor(ins, 0, "input", chw=True, nhwc=True, view=True)]


@_converts("Slice", 10, 11, 13)
def _slice(b: _Builder, ins: Ins, attrs: Attrs) -> Outs:
    """A computed tensor's positions along axes that do not hold the batch, at constant bounds (the dynamo
    exporter's q, k and v taken from one projection, a class token's row): a Take along each axis the bounds
    narrow."""
    x = b.tensor(ins, 0, "data", view=True)
    starts = [int(v) for v in np.asarray(b.const(ins, 1, "starts")).reshape(-1)]
    ends = [int(v) for v in np.asarray(b.const(ins, 2, "ends")).reshape(-1)]
    given_axes, given_steps = b.const(ins, 3, "axes", optional=True), b.const(ins, 4, "steps", optional=True)
    axes = [int(v) for v in given_axes.reshape(-1)] if given_axes is not None else list(range(len(starts)))
    steps = [int(v) for v in given_steps.reshape(-1)] if given_steps is not None else [1] * len(starts)
    y = x
    for axis, start, end, step in zip(axes, starts, ends, steps):
        axis %= len(y.dims)
        if y.view is not None:  # the batch moved: the axis through the view
            raw, groups = _views.groups_of(b, y)
            at = _views.single(raw, groups, axis, "slices along")
        else:
            _no_batch_axis(b, [axis], "slices along")
            raw = _as_tensor(b, y)
            at = raw.axis(axis)
        positions = list(range(*slice(start, end, step).indices(raw.shape[at])))
        if not positions:
            raise _Refuse(f"slices axis {axis} to nothing (an empty tensor)")
        if positions == list(range(raw.shape[at])):
            continue
        if y.view is not None:
            y = _views.run(b, nn.Take(positions, at), [raw], groups)
        else:
            y = b.add(nn.Take(positions, at), [raw], lifted=raw.lifted)
    return [y]


@_converts("Split", 2, 11, 13, 18)
def _split(b: _Builder, ins: Ins, attrs: Attrs) -> Outs:
    """Pieces of a computed tensor along an axis that does not hold the batch: equal ones each a Split,
    others a Take of their positions."""
    x = b.tensor(ins, 0, "input", view=True)
    raw, groups = _views.groups_of(b, x)
    axis = int(attrs.get("axis", 0)) % len(groups)
    at = _views.single(raw, groups, axis, "splits along")
    length = raw.shape[at]
    given = b.const(ins, 1, "split", optional=True) if b.opset >= 13 else None
    sizes = [int(s) for s in given.reshape(-1)] if given is not None else _ints(attrs, "split", [])
    if not sizes:
        count = int(attrs.get("num_outputs", len(b.node.output)))
        piece = -(-length // count)
        sizes = [min(piece, length - k * piece) for k in range(count)]
    if sum(sizes) != length or min(sizes) < 1:
        raise _Refuse(f"splits an axis of {length} into {sizes}")
    out, start = [], 0
    for k, size in enumerate(sizes):
        if all(s == size for s in sizes):
            layer: nn.Layer = nn.Split(len(sizes), k, at)
        else:
            layer = nn.Take(list(range(start, start + size)), at)
        out.append(_views.run(b, layer, [raw], groups))
        start += size
    return out
