"""The ONNX importer's converters for masks and broadcasts: a computed tensor compared with a constant
(Greater, Less, Equal and their kin, Not, a Cast to bool) held as a comparison not yet made, a Where choosing
by it between constants, or a constant and the tensor compared (one :class:`vmem.nn.Select`: a padding
mask's -inf, a bound written out), and Expand of a computed tensor along its axes of length 1
(:class:`vmem.nn.Expand`)."""

from __future__ import annotations

from typing import Callable

import numpy as np

from .. import nn
from . import _views
from ._builder import Attrs, Ins, Outs, BATCH, _Builder, _converts, _Mask, _Refuse, _Tensor

_COMPARE = {"Greater": ">", "Less": "<", "GreaterOrEqual": ">=", "LessOrEqual": "<=", "Equal": "=="}
_SWAPPED = {">": "<", "<": ">", ">=": "<=", "<=": ">=", "==": "=="}


def _compare(op: str) -> Callable[[_Builder, Ins, Attrs], Outs]:
    def convert(b: _Builder, ins: Ins, attrs: Attrs) -> Outs:
        a, c = ins[0], ins[1]
        cmp = _COMPARE[op]
        if not isinstance(a, _Tensor):  # the constant first: the comparison turned round
            a, c, cmp = c, a, _SWAPPED[cmp]
        if not isinstance(a, _Tensor) or not isinstance(c, np.ndarray) or c.size != 1:
            raise _Refuse("compares two computed tensors, or with a constant of more than one value")
        x = b.tensor([a], 0, "operand", view=True)
        return [_Mask(x, cmp, float(c.reshape(-1)[0]))]

    return convert


for _op, _versions in (
    ("Greater", (7, 9, 13)),
    ("Less", (7, 9, 13)),
    ("GreaterOrEqual", (12, 16)),
    ("LessOrEqual", (12, 16)),
    ("Equal", (7, 11, 13, 19)),
):
    _converts(_op, *_versions)(_compare(_op))


@_converts("IsNaN", 9, 13, 20)
def _isnan(b: _Builder, ins: Ins, attrs: Attrs) -> Outs:
    """Where a computed tensor is NaN (attention's softmax, NaN-to-zero where every position is masked):
    held until a Where reads it, as a comparison is."""
    if not isinstance(ins[0], _Tensor):
        raise _Refuse("tests a value that is not a computed tensor")
    return [_Mask(b.tensor(ins, 0, "input", view=True), "isnan", 0.0)]


@_converts("Not", 1)
def _not(b: _Builder, ins: Ins, attrs: Attrs) -> Outs:
    if not isinstance(ins[0], _Mask):
        raise _Refuse("negates a tensor that is not a comparison of a computed tensor with a constant")
    return [ins[0].negated()]


@_converts("Where", 9, 16)
def _where(b: _Builder, ins: Ins, attrs: Attrs) -> Outs:
    mask, a, c = ins[0], ins[1], ins[2]
    if not isinstance(mask, _Mask):
        raise _Refuse("chooses by a condition that is not a comparison of a computed tensor with a constant")
    x = mask.x
    itself = [v is x or (isinstance(v, _Tensor) and v.node is x.node and v.shape == x.shape) for v in (a, c)]
    if not all(isinstance(v, np.ndarray) or same for v, same in zip((a, c), itself)) or all(itself):
        raise _Refuse(
            "chooses between computed tensors (vmem's Select chooses between constants, or a constant and the "
            "tensor compared)"
        )
    raw, groups = _views.groups_of(b, x)
    laid = [
        None if same else _views.constant(raw, groups, np.asarray(v, np.float64)) for v, same in zip((a, c), itself)
    ]
    if any(v is None and not same for v, same in zip(laid, itself)):
        raise _Refuse(f"a value of shape {np.shape(a)} or {np.shape(c)} varies along the batch axis of {x.dims}")
    try:
        layer = nn.Select(mask.cmp, mask.threshold, laid[0], laid[1])
    except ValueError as exc:
        raise _Refuse(str(exc)) from None
    return [_views.run(b, layer, [raw], groups)]


@_converts("Expand", 8, 13)
def _expand(b: _Builder, ins: Ins, attrs: Attrs) -> Outs:
    x = b.tensor(ins, 0, "input", view=True)
    target = b.const(ins, 1, "shape")
    assert target is not None
    raw, groups = _views.groups_of(b, x)
    return [expanded(b, raw, groups, [int(d) for d in target.reshape(-1)])]


def expanded(b: _Builder, raw: _Tensor, groups: _views.Groups, target: list[int]) -> _Tensor:
    """``raw`` (seen through ``groups``) broadcast to the model's ``target`` (of no higher rank: a batch-first
    tensor gains no leading axes), along axes of length 1 that are one vmem axis each."""
    dims = _views.model_shape(raw, groups)
    if len(target) > len(dims):
        raise _Refuse(f"expands {_views.shown(dims)} to {_views.shown(target)}: more axes, before the batch axis")
    target = [1] * (len(dims) - len(target)) + target
    shape = list(raw.shape)
    for j, (d, t) in enumerate(zip(dims, target)):
        if t in (1, d) or t >= BATCH or d >= BATCH:
            continue
        if d != 1 or len(groups[j]) != 1:
            raise _Refuse(f"expands axis {j} of {_views.shown(dims)} to {t}: only an axis of length 1 repeats")
        shape[groups[j][0]] = t
    if tuple(shape) == raw.shape:
        return _views.viewed(raw, groups)
    return _views.run(b, nn.Expand(shape[1:]), [raw], groups)
