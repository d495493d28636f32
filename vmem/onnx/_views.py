"""The batch axis where the model puts it: a value of the model seen through a view of a vmem tensor.

vmem keeps the batch axis first, on every tensor. A model may move it: PyTorch's attention transposes a
(N, T, E) sequence to (T, N, E), merges the batch with the heads into (T, N * heads, d), transposes that to
(N * heads, T, d) and splits it again into (N, heads, T, d). Such a value is imported as a vmem tensor (batch
first) and a *view* (``_Tensor.view``): for each of the model's axes, the vmem axes it is made of, in the
model's row-major order (one for a plain axis, several where the model merged them, none for an axis of
length 1 that vmem does not hold). Transposes, merges and most splits are then bookkeeping, not copies;
an op runs on the vmem tensor directly where it reads its axes as they are (an element-wise op, a softmax
or a mean along a single axis, a split or take), and where it needs them in a row (a linear layer, a layer
norm, a batched product) the vmem tensor is first arranged in the model's order (:func:`arrange`: one
Transpose, one Reshape). Only an op that would mix samples is refused: one that reduces, normalizes,
gathers or concatenates along an axis that holds the batch.

A view whose batch axis is the model's first, alone, is a plain tensor again (:func:`settle`): everything
else in the importer reads only plain tensors.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from .. import nn
from ._builder import BATCH, _as_tensor, _Builder, _Refuse, _Tensor

Groups = tuple[tuple[int, ...], ...]

__all__ = [
    "Groups",
    "groups_of",
    "viewed",
    "settle",
    "plain",
    "where",
    "arrange",
    "reshape",
    "model_shape",
    "single",
    "constant",
    "one_sample",
    "run",
]


def _raw(x: _Tensor) -> _Tensor:
    """The vmem tensor itself, every axis as vmem holds it."""
    return _Tensor(x.node, x.shape)


def groups_of(b: _Builder, x: _Tensor) -> tuple[_Tensor, Groups]:
    """``x`` as a vmem tensor and the view the model sees it through (a plain tensor's: one vmem axis per
    model axis; an image is first held lifted, in its logical order)."""
    if x.view is not None:
        return _raw(x), x.view
    if x.nhwc or x.chw is not None:
        raise _Refuse("moves the batch axis of a map flattened or transposed for a classifier")
    x = _as_tensor(b, x)
    return _raw(x), tuple((x.axis(a),) for a in range(len(x.dims)))


def unit_free(x: _Tensor, groups: Groups) -> tuple[_Tensor, Groups]:
    """``groups`` without the axes of length 1 a group merges with others (they change no value's place: the
    model's (1 x N) axis is vmem's batch): ``(x, groups)``."""
    out = []
    for g in groups:
        kept = tuple(a for a in g if a == 0 or x.shape[a] != 1) if len(g) > 1 else g
        out.append(kept or g[:1])
    return x, tuple(out)


def viewed(x: _Tensor, groups: Groups) -> _Tensor:
    """The vmem tensor ``x`` seen through ``groups``: a plain tensor where the view is vmem's own order (with
    the axis of length 1 a lifted tensor holds after the batch axis), else a viewed one."""
    rank = len(x.shape)
    if groups == tuple((a,) for a in range(rank)) and rank != 4:
        return _Tensor(x.node, x.shape)
    if rank == 5 and x.shape[1] == 1 and groups == ((0,), (2,), (3,), (4,)):
        return _Tensor(x.node, x.shape, lifted=True)
    return _Tensor(x.node, x.shape, view=groups)


def where(x: _Tensor) -> str:
    """Where a viewed value holds the batch, for a refusal (with what to do where the model has none)."""
    assert x.view is not None
    at = next(k for k, g in enumerate(x.view) if 0 in g)
    merged = " merged with other axes" if len(x.view[at]) > 1 else ""
    return (
        f"the batch in axis {at} of {x.dims}{merged}; a model whose first axis is not a batch imports with "
        "vmem.onnx.load(..., batch=False)"
    )


def shown(shape: Sequence[int]) -> str:
    """A model's shape for a message: the batch's stand-in written N."""
    return "(" + ", ".join(f"N*{d // BATCH}" if d > BATCH else "N" if d == BATCH else str(d) for d in shape) + ")"


def model_shape(x: _Tensor, groups: Groups | None = None) -> list[int]:
    """The model's shape of a viewed value (or of the vmem tensor ``x`` seen through ``groups``), the batch's
    stand-in (:data:`BATCH`) times what it is merged with."""
    groups = x.view if groups is None else groups
    assert groups is not None
    return [math.prod(x.shape[a] for a in g) * (BATCH if 0 in g else 1) for g in groups]


def single(x: _Tensor, groups: Groups, axis: int, what: str) -> int:
    """The one vmem axis that the model's ``axis`` is (refused where it holds the batch or several axes)."""
    g = groups[axis]
    if 0 in g:
        raise _Refuse(
            f"{what} axis {axis}, which holds the batch (vmem keeps samples apart; a model whose first axis is "
            "not a batch imports with vmem.onnx.load(..., batch=False))"
        )
    if len(g) != 1:
        raise _Refuse(f"{what} axis {axis}, which merges axes the model made by a reshape")
    return g[0]


def arrange(b: _Builder, x: _Tensor, groups: Groups) -> tuple[_Tensor, Groups]:
    """The vmem tensor ``x`` copied into the model's order: its axes in the order the view names them, each
    group without the batch merged into one axis, the axes of length 1 no group names dropped (an axis of
    length 1 after the batch where the tensor would be 4-D: vmem stores 4-D tensors as images). A group with
    the batch keeps its other axes apart (vmem cannot merge the batch with them)."""
    rank = len(x.shape)
    order = [a for g in groups for a in g if a != 0]
    unnamed = [a for a in range(1, rank) if a not in order]
    perm = [0, *order, *unnamed]
    if perm != list(range(rank)):
        x = b.add(nn.Transpose(perm), [x])
    at = {a: i for i, a in enumerate(perm)}
    shape: list[int] = [x.shape[0]]
    out: list[tuple[int, ...]] = []
    for g in groups:
        if 0 in g:
            members = []
            for a in g:
                if a == 0:
                    members.append(0)
                else:
                    members.append(len(shape))
                    shape.append(x.shape[at[a]])
            out.append(tuple(members))
        elif g:
            out.append((len(shape),))
            shape.append(math.prod(x.shape[at[a]] for a in g))
        else:
            out.append(())
    if len(shape) == 4:
        shape.insert(1, 1)
        out = [tuple(a + 1 if a else 0 for a in g) for g in out]
    if tuple(shape) != x.shape:
        x = b.add(nn.Reshape(shape[1:]), [x])
    return _raw(x), tuple(out)


def settle(b: _Builder, x: _Tensor) -> _Tensor | None:
    """A viewed value as a plain tensor (its batch axis the model's first, alone), arranged; None where the
    model's batch axis is elsewhere."""
    assert x.view is not None
    first = x.view[0]
    if 0 not in first or any(x.shape[a] != 1 for a in first if a):  # (axes of length 1 merged with it aside)
        return None
    y, groups = arrange(b, _raw(x), ((0,), *x.view[1:]))
    out = viewed(y, groups)
    assert out.view is None, (y.shape, groups)
    return out


def plain(b: _Builder, x: _Tensor, what: str) -> _Tensor:
    """A viewed value as a converter that reads the batch axis first takes it (:func:`settle`), or refused
    (``what``: the input, for the message)."""
    out = settle(b, x)
    if out is None:
        raise _Refuse(f"reads the batch axis first; its {what} holds {where(x)}")
    return out


def reshape(b: _Builder, x: _Tensor, groups: Groups, dims: Sequence[int]) -> _Tensor:
    """``x`` (seen through ``groups``) reshaped to the model's ``dims``: the batch's stand-in (:data:`BATCH`,
    times what it is merged with) where the batch goes, -1 for what is left, 0 to keep an axis. Merges are
    bookkeeping; an axis split where the model splits it (one vmem Reshape).

    A model exported at a fixed batch size (its input declares one: ``b.static_batch``) writes that size
    instead of the stand-in: an axis of ``dims`` that is the example batch times the axes merged with it,
    where the view puts the batch, is read as the batch (:func:`_static`)."""
    try:
        shape, out = _reshaped(x, groups, dims)
    except _Refuse as refused:
        shape, out = _static(b, x, groups, dims, refused)
    y = _raw(x) if shape == x.shape else b.add(nn.Reshape(shape[1:]), [_raw(x)])
    return viewed(_raw(y), out)


def _static(b: _Builder, x: _Tensor, groups: Groups, dims: Sequence[int], refused: _Refuse) -> tuple:
    """:func:`_reshaped` of ``dims`` with the one axis that holds the example batch (``b.static_batch``) read
    as the batch; ``refused`` again where none or several axes can, or the shapes say nothing of the batch."""
    n = b.static_batch
    if n < 1 or any(d >= BATCH for d in dims):
        raise refused
    if n == 1:
        raise _Refuse(
            f"{refused}; the model was exported at batch 1, which its shapes cannot tell apart from the other axes "
            "of length 1: export it with a batch axis that may vary (torch.onnx.export(..., dynamic_shapes=...), "
            "or dynamic_axes with dynamo=False)"
        )
    found = {}
    for k, d in enumerate(dims):
        if d > 0 and d % n == 0:
            trial = list(dims)
            trial[k] = d // n * BATCH
            try:
                found[k] = _reshaped(x, groups, trial)
            except _Refuse:
                continue
    if len(set(found.values())) == 1:
        return next(iter(found.values()))
    if found:
        raise _Refuse(
            f"{refused}: exported at batch {n}, axes {sorted(found)} of {list(dims)} could each hold it; export it "
            "with a batch axis that may vary (dynamic_shapes, or dynamic_axes with dynamo=False)"
        )
    raise refused


def _reshaped(x: _Tensor, groups: Groups, dims: Sequence[int]) -> tuple[tuple[int, ...], Groups]:
    """What :func:`reshape` makes, without making it: the vmem tensor's new shape and the view of it."""
    current = model_shape(x, groups)
    dims = [current[i] if d == 0 and i < len(current) else int(d) for i, d in enumerate(dims)]
    size = dict(enumerate(x.shape))
    fine = [a for g in groups for a in g]
    total = math.prod(size[a] for a in fine if a != 0)
    carries = [d >= BATCH for d in dims]
    for d in dims:
        if d >= BATCH and d % BATCH:
            raise _Refuse(f"shape {shown(dims)} depends on the batch size other than by a multiple of it")
    if sum(carries) > 1 or dims.count(-1) > 1 or min(dims, default=1) < -1:
        raise _Refuse(f"shape {shown(dims)} is not a shape with one batch axis")
    known = math.prod(d // BATCH if d >= BATCH else d for d in dims if d != -1)
    if -1 in dims:
        if known == 0 or total % known:
            raise _Refuse(f"shape {shown(dims)} does not fit {shown(current)}")
        k = dims.index(-1)
        dims[k] = total // known
        carries[k] = not any(carries)
        if carries[k]:
            dims[k] *= BATCH
    if not any(carries):
        raise _Refuse(f"shape {shown(dims)} leaves no axis for the batch (it would mix samples)")
    axes = list(range(len(x.shape)))  # vmem's axes, by id, in their order; a split replaces one by two
    fresh = len(x.shape)
    out: list[tuple[int, ...]] = []
    i = 0
    for d, batch in zip(dims, carries):
        need, group, got, have = (d // BATCH if batch else d), [], False, 1
        while have < need or (batch and not got):
            if i == len(fine):
                raise _Refuse(f"cannot reshape {shown(current)} to {shown(dims)}")
            a = fine[i]
            if a == 0:
                if not batch:
                    raise _Refuse(f"reshapes {shown(current)} to {shown(dims)}: that would split the batch axis")
                got = True
            elif need % (have * size[a]) == 0:
                have *= size[a]
            elif need % have == 0 and need > have and size[a] % (need // have) == 0:  # the axis split: its first part
                first, second = fresh, fresh + 1
                fresh += 2
                size[first], size[second] = need // have, size[a] // (need // have)
                axes[axes.index(a) : axes.index(a) + 1] = [first, second]
                fine[i : i + 1] = [first, second]
                a = first
                have *= size[a]
            else:
                raise _Refuse(f"cannot reshape {shown(current)} to {shown(dims)}: it mixes the batch with other axes")
            group.append(a)
            i += 1
        if need == 1 and not group and i < len(fine) and fine[i] != 0 and size[fine[i]] == 1:
            group.append(fine[i])  # an axis of length 1 the model keeps: one vmem axis, that may repeat
            i += 1
        out.append(tuple(group))
    if any(a == 0 or size[a] != 1 for a in fine[i:]):
        raise _Refuse(f"cannot reshape {shown(current)} to {shown(dims)}")
    if len(axes) == 4:  # not an image: held with an axis of length 1 after the batch
        size[fresh] = 1
        axes.insert(1, fresh)
    shape = tuple(size[a] for a in axes)
    index = {a: k for k, a in enumerate(axes)}
    return shape, tuple(tuple(index[a] for a in g) for g in out)


def one_sample(value: np.ndarray, axis: int) -> np.ndarray | None:
    """``value`` with its ``axis`` (the batch's) of length 1, where it is longer and every slice along it
    is the same (a constant made for the batch and written out at the example batch); None otherwise."""
    if value.shape[axis] < 2:
        return None
    first = np.take(value, [0], axis=axis)
    return first if (value == first).all() else None


def constant(x: _Tensor, groups: Groups, value: np.ndarray) -> np.ndarray | None:
    """A constant operand of a viewed value (broadcast as the model does) in the vmem tensor's layout; None
    where an axis it varies along is not one vmem axis. One the same for every sample, written out along
    the batch axis (an export at a fixed batch fills a mask's zeros so), is that one sample's."""
    value = np.asarray(value)
    rank = len(groups)
    if value.ndim > rank:
        return None
    value = value.reshape((1,) * (rank - value.ndim) + value.shape)
    for j, g in enumerate(groups):  # the same for every sample, written out at the example batch: one row
        one = one_sample(value, j) if g == (0,) else None
        value = value if one is None else one
    varies = [j for j in range(rank) if value.shape[j] != 1]
    if any(len(groups[j]) != 1 or groups[j] == (0,) for j in varies):
        return None
    target = [1] * len(x.shape)
    for j in varies:
        target[groups[j][0]] = value.shape[j]
    kept = value.reshape([value.shape[j] for j in varies]) if varies else value.reshape(())
    order = sorted(range(len(varies)), key=lambda k: groups[varies[k]][0])
    return np.ascontiguousarray(kept.transpose(order)).reshape(target) if varies else kept


def run(b: _Builder, layer: nn.Layer, inputs: Sequence[_Tensor], groups: Groups, params: Any = None) -> _Tensor:
    """``layer`` on the vmem tensors ``inputs``; its output seen through ``groups``."""
    y = b.add(layer, [_raw(t) for t in inputs], params)
    return viewed(_raw(y), groups)
