"""Which tensors need a gradient, and the live ranges of gradient buffers over the backward pass.

The backward pass runs the loss first, then the ops in reverse. The gradient of a tensor is written by the
backward of its last consumer, accumulated from any other consumer through a temporary buffer, and read
by its producer's backward. Its live range in backward steps is therefore known statically; an in-place
layer's input gradient shares its output gradient's buffer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..graph import Program
from ..graph.analysis import needs_grad
from .steps import Accumulate, AccumulateParam, Buffer, Key, Kind

__all__ = ["needs_grad", "Gradients", "gradients", "param_temps"]  # needs_grad: vmem.graph.analysis's


@dataclass
class Gradients:
    """Live ranges of gradient buffers in backward steps (0 = the loss, op i -> n - i)."""

    intervals: dict[Key, list[int]]  # buffer -> [first step, last step, nbytes]
    of_tensor: dict[int, Key]  # tensor -> its gradient buffer (in-place groups share one)
    acc: dict[tuple[int, int], Key]  # (op, input position) -> the temporary of a later contribution
    acc_steps: dict[int, list[Accumulate]]  # op -> accumulations after its backward


def _inplace_groups(program: Program, needs: list[bool]) -> list[int]:
    """Union-find over tensors: an in-place layer's input gradient is its output's."""
    group = list(range(len(program.tensors)))

    def find(t: int) -> int:
        while group[t] != t:
            group[t] = group[group[t]]
            t = group[t]
        return t

    for op in program.ops:
        if op.inplace and needs[op.inputs[0]]:
            group[find(op.inputs[0])] = find(op.output)
    return [find(t) for t in range(len(group))]


def gradients(program: Program, needs: list[bool]) -> Gradients:
    """Every gradient buffer's live range, which tensors share it, and the temporaries of later
    contributions (made once per Program and ``needs``; the dicts a lowering changes are fresh copies)."""
    made = program.derived(("gradients", tuple(needs)), lambda: _gradients(program, needs))
    return Gradients(dict(made.intervals), dict(made.of_tensor), made.acc, made.acc_steps)


def _gradients(program: Program, needs: list[bool]) -> Gradients:
    ops, tensors = program.ops, program.tensors
    n = len(ops)
    if tensors[program.output].consumers:
        raise ValueError(f"{program.network}: the network's output is also used by a layer; it must feed only the loss")
    root = _inplace_groups(program, needs)
    grads = Gradients({}, {}, {}, {})
    for t in tensors:
        if not needs[t.id]:
            continue
        contributors = sorted({c for c in t.consumers if needs[ops[c].output]}, reverse=True)
        first = 0 if t.id == program.output else n - contributors[0]
        last = n - t.producer  # type: ignore[operator]
        key = grads.of_tensor[t.id] = Key(Kind.GRAD, tensors[root[t.id]].name)
        iv = grads.intervals.setdefault(key, [first, last, t.nbytes])
        iv[0], iv[1], iv[2] = min(iv[0], first), max(iv[1], last), max(iv[2], t.nbytes)
        # the first contribution is written in place; every later one goes through a temporary
        positions = [(c, j) for c in contributors for j, i in enumerate(ops[c].inputs) if i == t.id]
        for c, j in positions[1:]:
            tmp = Key(Kind.ACC, ops[c].name, str(j))
            grads.intervals[tmp] = [n - c, n - c, t.nbytes]
            grads.acc[(c, j)] = tmp
            grads.acc_steps.setdefault(c, []).append(Accumulate(t.id, tmp))
    return grads


def param_temps(
    program: Program, needs: list[bool], every: bool = False
) -> tuple[dict[int, dict[str, Key]], dict[int, list[AccumulateParam]], dict[Key, Buffer]]:
    """Shared parameters: the first backward (in backward order) that uses one writes its gradient; every
    later one writes into a temporary (one per parameter, reused) that is then added to it. With ``every``
    (a micro-batch after the first: the gradients so far are kept), every backward adds. Returns
    op -> parameter -> temporary, op -> the additions after its backward, and the temporaries' buffers
    (made once per Program, ``needs`` and ``every``, shared: not to be changed)."""
    return program.derived(("param_temps", tuple(needs), every), lambda: _param_temps(program, needs, every))


def _param_temps(
    program: Program, needs: list[bool], every: bool
) -> tuple[dict[int, dict[str, Key]], dict[int, list[AccumulateParam]], dict[Key, Buffer]]:
    users: dict[str, list[tuple[int, str]]] = {}  # "owner.param" -> (op, its name there) of each use
    for op in program.ops:
        if needs[op.output]:
            for k, spec in op.params.items():
                if spec.trainable:
                    users.setdefault(op.param_key(k), []).append((op.index, k))
    temps: dict[int, dict[str, Key]] = {}
    adds: dict[int, list[AccumulateParam]] = {}
    buffers: dict[Key, Buffer] = {}
    for param, uses in users.items():
        owner, name = param.rsplit(".", 1)
        for i, k in sorted(uses) if every else sorted(uses)[:-1]:
            key = Key(Kind.ACC, owner, name)
            nbytes = max(1, int(np.prod(program.ops[i].params[k].shape)) * program.precision.itemsize("gradients"))
            buffers[key] = Buffer(key, nbytes, "weight_grads")
            temps.setdefault(i, {})[k] = key
            adds.setdefault(i, []).append(AccumulateParam(param, key, nbytes))
    return temps, adds, buffers
