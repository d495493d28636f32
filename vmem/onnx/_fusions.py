"""Ops exporters write out that the ONNX importer fuses back into one layer: GELU written with Erf (or Tanh),
and layer norm written as ReduceMean, Sub, Pow, Sqrt and Div (opsets before 17). Each finds its pattern in
one view of the graph (:class:`_Pattern`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from types import ModuleType

__all__ = ["_Pattern", "_gelus", "_layer_norms"]


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
