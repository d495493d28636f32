"""What the ONNX importer computes at import: a node whose inputs are all constants (a shape computation, a
weight the model computes rather than stores), by ONNX's reference implementation, with its limits; and the
shape a ``Shape`` node reads off a computed tensor (the batch's stand-in where the batch is)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from . import _views
from ..units import format_bytes
from ._builder import BATCH, _MOST_FOLDED, _MOST_FOLDED_TOTAL, _Refuse, _Tensor

if TYPE_CHECKING:
    from types import ModuleType

__all__ = ["_fold", "_shape_of"]


def _fold(onnx: ModuleType, node: Any, ins: list[Any], opset: int, room: int = _MOST_FOLDED_TOTAL) -> list[Any]:
    """Outputs of a node whose inputs are all constants, by ONNX's reference implementation; ``room``: the
    bytes the import's computed constants may still take (refused beyond)."""
    from onnx.reference import ReferenceEvaluator

    if node.op_type == "Expand" and len(ins) == 2 and isinstance(ins[1], np.ndarray) and (ins[1] >= BATCH).any():
        # a constant broadcast along the batch axis (positions expanded to the batch's ids): kept with that
        # axis of length 1, which every layer reading it broadcasts
        ins = [ins[0], np.where(ins[1] >= BATCH, 1, ins[1])]
    if node.op_type == "ConstantOfShape" and ins and isinstance(ins[0], np.ndarray) and (ins[0] == BATCH).any():
        # a fill of the batch's size is the same for every sample: made with that axis of length 1
        ins = [np.where(ins[0] == BATCH, 1, ins[0]), *ins[1:]]
    if node.op_type in ("ConstantOfShape", "Expand", "Tile", "Range", "RandomNormalLike", "RandomUniformLike"):
        if any(isinstance(v, np.ndarray) and v.dtype.kind in "iu" and (v >= BATCH).any() for v in ins):
            raise _Refuse("makes a constant whose size depends on the batch size")
    if node.op_type == "ConstantOfShape" and ins and isinstance(ins[0], np.ndarray):  # sized before it is made
        _check_folded(int(np.prod(ins[0], dtype=np.float64)) * 4, room)
    exact = _exact(onnx, node, ins)
    if exact is not None:
        return exact
    if any(isinstance(v, np.ndarray) and v.dtype == np.float64 for v in ins):  # with a value made exact below
        ins = [v.astype(np.float64) if isinstance(v, np.ndarray) and v.dtype == np.float32 else v for v in ins]
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
        _check_folded(v.nbytes, room)
        room -= v.nbytes
    return out


def _exact(onnx: ModuleType, node: Any, ins: list[Any]) -> list[Any] | None:
    """A small number computed from the model's shapes (a softmax's scale, 1 / sqrt(sqrt(d))) kept in float64
    where the model casts it to float: what PyTorch computes it in, so that a float64 step is PyTorch's to
    the last bits (in float32 it rounds to the same value)."""
    if node.op_type != "Cast" or not ins or not isinstance(ins[0], np.ndarray) or ins[0].size > 16:
        return None
    to = next((a.i for a in node.attribute if a.name == "to"), None)
    if to != onnx.TensorProto.FLOAT or not (ins[0].dtype.kind in "iu" or ins[0].dtype == np.float64):
        return None
    return [ins[0].astype(np.float64)]


def _check_folded(nbytes: int, room: int = _MOST_FOLDED_TOTAL) -> None:
    if nbytes > _MOST_FOLDED:
        raise _Refuse(
            f"computes a constant of {format_bytes(nbytes)} at import (at most {format_bytes(_MOST_FOLDED)}: "
            "a shape computation or a computed weight, never a feature map)"
        )
    if nbytes > room:
        raise _Refuse(
            f"computes a constant of {format_bytes(nbytes)} at import, beyond the "
            f"{format_bytes(_MOST_FOLDED_TOTAL)} that all of a model's computed constants may take together"
        )


def _shape_of(x: _Tensor, attrs: dict[str, Any]) -> np.ndarray:
    shape = (x.shape[0], x.shape[2], x.shape[3], x.shape[1]) if x.nhwc else x.dims
    if x.view is not None:
        dims = np.array(_views.model_shape(x), np.int64)
    else:
        dims = np.array(shape if x.lead else (BATCH,) + tuple(shape[1:]), np.int64)
    start, end = int(attrs.get("start", 0)), attrs.get("end")
    return dims[start : None if end is None else int(end)]
