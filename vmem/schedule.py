"""Lowering: a Program and a Plan become the exact sequence of allocations, frees and ops of one step.

This is a pure function shared by the executor (which carries the steps out on a device) and the planner
(which replays the same allocations through the pool code without data), so that a plan's predicted
peak is the peak the step sees.

Steps are tuples: ``("alloc", buffer)``, ``("free", buffer)``, ``("fwd", op)``, ``("loss",)``,
``("bwd", op)``, ``("acc", tensor, temp_buffer)`` (add a second gradient contribution), ``("update",)``.

Gradients. The backward pass runs the loss first, then the ops in reverse. The gradient of a tensor is
written by the backward of its last consumer, accumulated from any other consumer through a temporary
buffer, and read by its producer's backward. Its live range in backward steps is therefore known
statically; an in-place layer's input gradient shares its output gradient's buffer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .graph import Program
from .policies.plan import Plan

__all__ = ["Buffer", "Schedule", "lower", "lower_inference"]


@dataclass(frozen=True)
class Buffer:
    name: str
    nbytes: int
    category: str


@dataclass
class Schedule:
    persistent: list[Buffer]  # allocated once, before the first step (weights, their gradients, optimizer state)
    buffers: dict[str, Buffer]  # allocated and freed within a step
    steps: list[tuple]
    value: dict[int, str]  # tensor id -> buffer holding its value
    grad: dict[int, str] = field(default_factory=dict)  # tensor id -> buffer holding its gradient
    aux: dict[tuple[int, str], str] = field(default_factory=dict)  # (op, name) -> buffer
    acc: dict[tuple[int, int], str] = field(default_factory=dict)  # (op, input position) -> temp buffer
    workspace: dict[int, str] = field(default_factory=dict)  # op -> workspace buffer
    needs_grad: list[bool] = field(default_factory=list)  # per tensor
    backward_ops: list[int] = field(default_factory=list)  # ops whose backward runs, in backward order

    def workspace_bytes(self, op: int) -> int:
        name = self.workspace.get(op)
        return self.buffers[name].nbytes if name else 0


def persistent_buffers(program: Program, optimizer_slots: tuple[str, ...]) -> list[Buffer]:
    """Weights (and non-trainable buffers such as running statistics), weight gradients, optimizer state."""
    out = []
    for op in program.ops:
        for k, spec in op.params.items():
            key = f"{op.name}.{k}"
            nbytes = int(np.prod(spec.shape)) * program.itemsize
            out.append(Buffer(f"w:{key}", nbytes, "weights"))
            if spec.trainable:
                out.append(Buffer(f"g:{key}", nbytes, "weight_grads"))
                for slot in optimizer_slots:
                    out.append(Buffer(f"o:{key}:{slot}", nbytes, "optimizer_state"))
    return out


def op_workspace(program: Program, plan: Plan, op_index: int) -> tuple[int, int]:
    """(forward, backward) workspace bytes of an op under the plan's algorithms."""
    op = program.ops[op_index]
    if not op.algorithms:
        return 0, 0
    algos = plan.algos.get(op.name, {})
    fwd = op.workspace["forward"].get(algos.get("forward"), 0)
    bwd = max(op.workspace["backward_data"].get(algos.get("backward_data"), 0),
              op.workspace["backward_filter"].get(algos.get("backward_filter"), 0))
    return fwd, bwd


def _needs_grad(program: Program) -> list[bool]:
    needs = [False] * len(program.tensors)
    for op in program.ops:
        has_params = any(s.trainable for s in op.params.values())
        needs[op.output] = has_params or any(needs[i] for i in op.inputs)
    return needs


def lower(program: Program, plan: Plan, optimizer_slots: tuple[str, ...] = ("momentum",)) -> Schedule:
    """The training step of ``plan`` (network-wide allocation; layer-wise comes with the vDNN policies)."""
    if plan.allocation != "network":
        raise ValueError(f"plan {plan.policy!r}: allocation {plan.allocation!r} cannot be lowered yet")
    ops, tensors = program.ops, program.tensors
    n = len(ops)
    needs = _needs_grad(program)
    buffers: dict[str, Buffer] = {}

    def add(name: str, nbytes: int, category: str) -> str:
        buffers[name] = Buffer(name, max(int(nbytes), 1), category)
        return name

    # Values: one buffer per distinct feature-map buffer (in-place layers share), plus saved state.
    value = {}
    for t in tensors:
        value[t.id] = f"fm:{t.buffer}"
        if t.buffer == t.id:
            add(f"fm:{t.id}", t.nbytes, "feature_maps")
    aux = {}
    for op in ops:
        for k, nbytes in op.aux_nbytes.items():
            aux[(op.index, k)] = add(f"aux:{op.name}.{k}", nbytes, "feature_maps")
    add("labels", program.batch * 8, "other")
    add("probs", program.batch * program.num_classes * program.itemsize, "feature_maps")
    add("loss", program.itemsize, "other")
    ws_bytes = max([max(op_workspace(program, plan, i)) for i in range(n)] + [0])
    workspace = {}
    if ws_bytes:
        add("ws", ws_bytes, "workspace")
        workspace = {i: "ws" for i in range(n) if max(op_workspace(program, plan, i))}

    # Gradients: live ranges in backward steps (0 = loss, op i -> n - i), in-place groups share a buffer.
    bstep = {i: n - i for i in range(n)}
    group = list(range(len(tensors)))  # union-find over gradient buffers

    def find(t: int) -> int:
        while group[t] != t:
            group[t] = group[group[t]]
            t = group[t]
        return t

    for op in ops:
        if op.inplace and needs[op.inputs[0]]:
            group[find(op.inputs[0])] = find(op.output)
    if len(tensors[program.output].consumers):
        raise ValueError(f"{program.network}: the network's output is also used by a layer; it must feed only the loss")
    intervals: dict[str, list[int]] = {}  # key -> [start, end, nbytes]
    acc: dict[tuple[int, int], str] = {}
    acc_steps: dict[int, list[tuple]] = {}
    for t in tensors:
        if not needs[t.id]:
            continue
        contributors = sorted({c for c in t.consumers if needs[ops[c].output]}, reverse=True)
        first = 0 if t.id == program.output else bstep[contributors[0]]
        last = bstep[t.producer]  # type: ignore[index]
        key = f"grad:{find(t.id)}"
        iv = intervals.setdefault(key, [first, last, t.nbytes])
        iv[0], iv[1], iv[2] = min(iv[0], first), max(iv[1], last), max(iv[2], t.nbytes)
        # every later contribution goes through a temporary and is added in
        positions = [(c, j) for c in contributors for j, i in enumerate(ops[c].inputs) if i == t.id]
        for c, j in positions[1:]:
            tmp = f"acc:{ops[c].name}.{j}"
            intervals[tmp] = [bstep[c], bstep[c], t.nbytes]
            acc[(c, j)] = tmp
            acc_steps.setdefault(c, []).append(("acc", t.id, tmp))

    # Network-wide allocation: gradient live ranges share slots (a dX/dY pair for a chain).
    slots: list[list[int]] = []  # [free after step, nbytes]
    slot_of: dict[str, str] = {}
    for key, (start, end, nbytes) in sorted(intervals.items(), key=lambda kv: (kv[1][0], kv[1][1], kv[0])):
        free = [s for s in range(len(slots)) if slots[s][0] < start]
        if free:
            s = min(free, key=lambda s: (abs(slots[s][1] - nbytes), s))
            slots[s] = [end, max(slots[s][1], nbytes)]
        else:
            slots.append([end, nbytes])
            s = len(slots) - 1
        slot_of[key] = f"gslot:{s}"
    for s, (_, nbytes) in enumerate(slots):
        add(f"gslot:{s}", nbytes, "gradient_maps")
    grad = {t.id: slot_of[f"grad:{find(t.id)}"] for t in tensors if needs[t.id]}
    acc = {k: slot_of[v] for k, v in acc.items()}
    acc_steps = {c: [(a, t, slot_of[tmp]) for a, t, tmp in steps] for c, steps in acc_steps.items()}

    backward_ops = [i for i in range(n - 1, -1, -1) if needs[ops[i].output]]
    steps: list[tuple] = [("alloc", name) for name in buffers]
    steps += [("fwd", i) for i in range(n)]
    steps.append(("loss",))
    for i in backward_ops:
        steps.append(("bwd", i))
        steps += acc_steps.get(i, [])
    steps.append(("update",))
    steps += [("free", name) for name in reversed(list(buffers))]
    return Schedule(persistent=persistent_buffers(program, optimizer_slots), buffers=buffers, steps=steps,
                    value=value, grad=grad, aux=aux, acc=acc, workspace=workspace, needs_grad=needs,
                    backward_ops=backward_ops)


def lower_inference(program: Program, plan: Plan) -> Schedule:
    """Forward only, layer by layer: each buffer is freed after its last consumer (nothing is stashed)."""
    ops, tensors = program.ops, program.tensors
    buffers: dict[str, Buffer] = {}
    value = {t.id: f"fm:{t.buffer}" for t in tensors}
    # last op reading each buffer (through any tensor aliasing it)
    last_use: dict[str, int] = {}
    for op in ops:
        for i in op.inputs + [op.output]:
            last_use[value[i]] = op.index
    last_use[value[program.output]] = len(ops)  # read by the host after the last op
    steps: list[tuple] = []
    aux, workspace = {}, {}

    def alloc(name: str, nbytes: int, category: str) -> None:
        buffers[name] = Buffer(name, max(int(nbytes), 1), category)
        steps.append(("alloc", name))

    alloc("fm:0", tensors[0].nbytes, "feature_maps")
    for op in ops:
        out = tensors[op.output]
        if out.buffer == out.id:
            alloc(f"fm:{out.id}", out.nbytes, "feature_maps")
        for k, nbytes in op.aux_nbytes.items():
            aux[(op.index, k)] = f"aux:{op.name}.{k}"
            alloc(aux[(op.index, k)], nbytes, "feature_maps")
        fwd_ws, _ = op_workspace(program, plan, op.index)
        if fwd_ws:
            workspace[op.index] = f"ws:{op.name}"
            alloc(workspace[op.index], fwd_ws, "workspace")
        steps.append(("fwd", op.index))
        if fwd_ws:
            steps.append(("free", workspace[op.index]))
        for k in op.aux_nbytes:
            steps.append(("free", aux[(op.index, k)]))
        for name in dict.fromkeys(value[i] for i in op.inputs):
            if last_use[name] == op.index:
                steps.append(("free", name))
    steps.append(("free", value[program.output]))  # after the host's read of the logits, in stream order
    return Schedule(persistent=[], buffers=buffers, steps=steps, value=value, aux=aux, workspace=workspace)
