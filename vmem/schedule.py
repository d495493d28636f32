"""Lowering: a Program and a Plan become the exact sequence of allocations, frees and ops of one step.

This is a pure function shared by the executor (which carries the steps out on a device) and the planner
(which replays the same allocations through the pool code without data), so that a plan's predicted
peak is the peak the step sees.

Steps are tuples: ``("alloc", buffer)``, ``("free", buffer)``, ``("fwd", op)``, ``("loss",)``,
``("bwd", op)``, ``("acc", tensor, temp_buffer)`` (add a second gradient contribution), ``("update",)``,
for offloading plans ``("offload", buffer)`` (copy to pinned host memory, through the buffer's codec if it
has one, then release), ``("prefetch", buffer)`` (copy back, decoding, into the buffer just allocated) and
``("wait", buffer)`` (the compute stream waits for that prefetch), and for encoding plans
``("encode", buffer)`` (encode into ``enc:<buffer>``, allocated just before) and ``("decode", buffer)``
(decode back into the buffer, allocated just before). A buffer binarized for sign-only readers (ReLU's
backward) is never decoded: those backward steps read the encoding.

Gradients. The backward pass runs the loss first, then the ops in reverse. The gradient of a tensor is
written by the backward of its last consumer, accumulated from any other consumer through a temporary
buffer, and read by its producer's backward. Its live range in backward steps is therefore known
statically; an in-place layer's input gradient shares its output gradient's buffer.
"""

from __future__ import annotations

from bisect import insort
from dataclasses import dataclass, field

import numpy as np

from . import codecs as _codecs
from .graph import Program
from .policies.plan import Plan

__all__ = ["Buffer", "Schedule", "lower", "lower_inference"]


@dataclass(frozen=True)
class Buffer:
    """A block the step allocates. ``high``: place it at the high end of free space (long-lived small
    buffers: saved state, labels), away from the large short-lived ones."""

    name: str
    nbytes: int
    category: str
    high: bool = False


@dataclass
class Schedule:
    persistent: list[Buffer]  # allocated once, before the first step (weights, their gradients, optimizer state)
    buffers: dict[str, Buffer]  # allocated and freed within a step
    steps: list[tuple]
    value: dict[int, str]  # tensor id -> buffer holding its value
    grad: dict[int, str] = field(default_factory=dict)  # tensor id -> buffer holding its gradient
    aux: dict[tuple[int, str], str] = field(default_factory=dict)  # (op, name) -> buffer
    acc: dict[tuple[int, int], str] = field(default_factory=dict)  # (op, input position) -> temp buffer
    workspace: dict[tuple[int, str], str] = field(default_factory=dict)  # (op, "fwd"|"bwd") -> buffer
    needs_grad: list[bool] = field(default_factory=list)  # per tensor
    backward_ops: list[int] = field(default_factory=list)  # ops whose backward runs, in backward order
    offsets: dict[int, int] = field(default_factory=dict)  # step index of an alloc -> planned arena offset
    codecs: dict[str, str] = field(default_factory=dict)  # buffer -> codec spec (offloaded or encoded)
    encoded: dict[str, str] = field(default_factory=dict)  # encoded buffer -> the buffer holding its encoding
    transfer: dict[str, int] = field(default_factory=dict)  # offloaded buffer -> bytes expected on the bus
    binarized: set[str] = field(default_factory=set)  # buffers whose backward readers use the bits directly

    def place(self, alignment: int = 256) -> "Schedule":
        """Plan an arena offset for every allocation of the step (see :func:`pack`); returns self."""
        self.offsets = pack(self, alignment)
        return self



def _align(n: int, alignment: int) -> int:
    return -(-max(n, 1) // alignment) * alignment


def pack(schedule: Schedule, alignment: int = 256) -> dict[int, int]:
    """Offline placement of a step's allocations: the schedule is static, so every block's lifetime is
    known and blocks can be packed so that the arena needs little more than the peak of live bytes.

    Each block goes at the lowest offset (or into the tightest gap) where it overlaps no already-placed
    block that is live at the same time, in three orders (largest first, as TensorFlow Lite's arena planner does; longest-lived
    first; allocation order); the order with the lowest top wins. Persistent buffers sit first,
    contiguously, as the trainer allocates them before any step.
    """
    base = sum(_align(b.nbytes, alignment) for b in schedule.persistent)
    open_: dict[str, int] = {}
    lives: list[tuple[int, int, int, int]] = []  # (size, start, end, alloc step)
    for index, st in enumerate(schedule.steps):
        if st[0] == "alloc":
            open_[st[1]] = index
        elif st[0] in ("free", "offload"):
            start = open_.pop(st[1])
            lives.append((_align(schedule.buffers[st[1]].nbytes, alignment), start, index, start))
    end = len(schedule.steps)
    for name, start in open_.items():  # never freed within the step
        lives.append((_align(schedule.buffers[name].nbytes, alignment), start, end, start))
    best: tuple[int, dict[int, int]] | None = None
    orders = (lambda l: (-l[0], -(l[2] - l[1]), l[1]),  # largest first (greedy by size)
              lambda l: (-(l[2] - l[1]), -l[0], l[1]),  # longest-lived first
              lambda l: (l[1], -l[0]))  # in allocation order (what an online first fit would do)
    for order in orders:
        for tightest in (False, True):
            placed: list[tuple[int, int, int, int]] = []  # (offset, size, start, end), sorted by offset
            offsets: dict[int, int] = {}
            top = base
            for size, start, stop, step in sorted(lives, key=order):
                offset, chosen, gap_size = base, None, None
                for o, sz, s0, s1 in placed:  # the gaps between blocks live at the same time, by offset
                    if s0 >= stop or s1 <= start:
                        continue
                    gap = o - offset
                    if gap >= size:
                        if not tightest:
                            chosen = offset
                            break
                        if gap_size is None or gap < gap_size:
                            chosen, gap_size = offset, gap
                    offset = max(offset, o + sz)
                offset = offset if chosen is None else chosen
                offsets[step] = offset
                top = max(top, offset + size)
                insort(placed, (offset, size, start, stop))
            if best is None or top < best[0]:
                best = (top, offsets)
    return best[1] if best else {}


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
    """The training step of ``plan``: network-wide (everything up front) or layer-wise allocation, with
    every allocation's place in the arena planned (:func:`pack`)."""
    if plan.allocation == "network":
        return _lower_network(program, plan, optimizer_slots).place()
    if plan.allocation == "layer":
        return _lower_layer(program, plan, optimizer_slots).place()
    raise ValueError(f"plan {plan.policy!r}: unknown allocation {plan.allocation!r}")


@dataclass
class _Gradients:
    """Live ranges of gradient buffers in backward steps (0 = the loss, op i -> n - i)."""

    intervals: dict[str, list[int]]  # name -> [first step, last step, nbytes]
    of_tensor: dict[int, str]  # tensor -> interval name (in-place groups share one)
    acc: dict[tuple[int, int], str]  # (op, input position) -> temporary's interval name
    acc_steps: dict[int, list[tuple]]  # op -> ("acc", tensor, temporary) after its backward


def _gradients(program: Program, needs: list[bool]) -> _Gradients:
    ops, tensors = program.ops, program.tensors
    n = len(ops)
    bstep = {i: n - i for i in range(n)}
    group = list(range(len(tensors)))  # union-find: an in-place layer's input gradient is its output's

    def find(t: int) -> int:
        while group[t] != t:
            group[t] = group[group[t]]
            t = group[t]
        return t

    for op in ops:
        if op.inplace and needs[op.inputs[0]]:
            group[find(op.inputs[0])] = find(op.output)
    if tensors[program.output].consumers:
        raise ValueError(f"{program.network}: the network's output is also used by a layer; it must feed only the loss")
    grads = _Gradients({}, {}, {}, {})
    for t in tensors:
        if not needs[t.id]:
            continue
        contributors = sorted({c for c in t.consumers if needs[ops[c].output]}, reverse=True)
        first = 0 if t.id == program.output else bstep[contributors[0]]
        last = bstep[t.producer]  # type: ignore[index]
        key = grads.of_tensor[t.id] = f"grad:{tensors[find(t.id)].name}"
        iv = grads.intervals.setdefault(key, [first, last, t.nbytes])
        iv[0], iv[1], iv[2] = min(iv[0], first), max(iv[1], last), max(iv[2], t.nbytes)
        # the first contribution is written in place; every later one goes through a temporary
        positions = [(c, j) for c in contributors for j, i in enumerate(ops[c].inputs) if i == t.id]
        for c, j in positions[1:]:
            tmp = f"acc:{ops[c].name}.{j}"
            grads.intervals[tmp] = [bstep[c], bstep[c], t.nbytes]
            grads.acc[(c, j)] = tmp
            grads.acc_steps.setdefault(c, []).append(("acc", t.id, tmp))
    return grads


def _values(program: Program) -> tuple[dict[int, str], dict[str, Buffer], dict[tuple[int, str], str]]:
    """Feature-map buffers (in-place layers share their input's) and saved state, by name."""
    buffers: dict[str, Buffer] = {}
    value = {}
    for t in program.tensors:
        value[t.id] = f"fm:{program.tensors[t.buffer].name}"
        if t.buffer == t.id:
            buffers[value[t.id]] = Buffer(value[t.id], max(t.nbytes, 1), "feature_maps")
    aux = {}
    for op in program.ops:
        for k, nbytes in op.aux_nbytes.items():
            aux[(op.index, k)] = f"aux:{op.name}.{k}"
            buffers[aux[(op.index, k)]] = Buffer(aux[(op.index, k)], max(nbytes, 1), "feature_maps", high=True)
    for name, nbytes, category in (("labels", program.batch * 8, "other"),
                                   ("probs", program.batch * program.num_classes * program.itemsize, "feature_maps"),
                                   ("loss", program.itemsize, "other")):
        buffers[name] = Buffer(name, nbytes, category, high=True)
    return value, buffers, aux


def _lower_network(program: Program, plan: Plan, optimizer_slots: tuple[str, ...]) -> Schedule:
    """Everything allocated up front and freed at the end; gradient live ranges share slots (a dX/dY
    pair for a chain) and one workspace serves every layer."""
    ops, tensors = program.ops, program.tensors
    n = len(ops)
    needs = _needs_grad(program)
    value, buffers, aux = _values(program)
    ws_bytes = max([max(op_workspace(program, plan, i)) for i in range(n)] + [0])
    workspace: dict[tuple[int, str], str] = {}
    if ws_bytes:
        buffers["ws"] = Buffer("ws", ws_bytes, "workspace")
        for i in range(n):
            fwd, bwd = op_workspace(program, plan, i)
            workspace.update({(i, p): "ws" for p, b in (("fwd", fwd), ("bwd", bwd)) if b})
    grads = _gradients(program, needs)
    slots: list[list[int]] = []  # [free after step, nbytes]
    slot_of: dict[str, str] = {}
    for key, (start, end, nbytes) in sorted(grads.intervals.items(), key=lambda kv: (kv[1][0], kv[1][1], kv[0])):
        free = [s for s in range(len(slots)) if slots[s][0] < start]
        if free:
            s = min(free, key=lambda s: (abs(slots[s][1] - nbytes), s))
            slots[s] = [end, max(slots[s][1], nbytes)]
        else:
            slots.append([end, nbytes])
            s = len(slots) - 1
        slot_of[key] = f"gslot:{s}"
    for s, (_, nbytes) in enumerate(slots):
        buffers[f"gslot:{s}"] = Buffer(f"gslot:{s}", nbytes, "gradient_maps")

    backward_ops = [i for i in range(n - 1, -1, -1) if needs[ops[i].output]]
    steps: list[tuple] = [("alloc", name) for name in buffers]
    steps += [("fwd", i) for i in range(n)]
    steps.append(("loss",))
    for i in backward_ops:
        steps.append(("bwd", i))
        steps += [(a, t, slot_of[tmp]) for a, t, tmp in grads.acc_steps.get(i, [])]
    steps.append(("update",))
    steps += [("free", name) for name in reversed(list(buffers))]
    return Schedule(
        persistent=persistent_buffers(program, optimizer_slots), buffers=buffers, steps=steps, value=value,
        grad={t.id: slot_of[grads.of_tensor[t.id]] for t in tensors if needs[t.id]}, aux=aux,
        acc={k: slot_of[v] for k, v in grads.acc.items()}, workspace=workspace, needs_grad=needs,
        backward_ops=backward_ops,
    )


def _lower_layer(program: Program, plan: Plan, optimizer_slots: tuple[str, ...]) -> Schedule:
    """Layer-wise allocation (vDNN): every buffer is allocated just before its first use and released
    after its last; stashed buffers the plan offloads leave after their last forward use and come back
    at the prefetch points the plan names."""
    ops, tensors = program.ops, program.tensors
    n = len(ops)
    needs = _needs_grad(program)
    value, buffers, aux = _values(program)
    grads = _gradients(program, needs)
    for name, (_, _, nbytes) in grads.intervals.items():
        buffers[name] = Buffer(name, max(nbytes, 1), "gradient_maps")
    by_name = {t.name: t.id for t in tensors}
    stashed = program.stashed_buffers()
    offloaded = {by_name[name] for name, d in plan.stash.items() if d == "offload"}
    encoded = {by_name[name] for name, d in plan.stash.items() if d == "encode"}
    unknown = (offloaded | encoded) - stashed
    if unknown:
        raise ValueError(f"plan {plan.policy!r} offloads or encodes buffers no backward reads: "
                         f"{sorted(tensors[b].name for b in unknown)}")
    codec_of, transfer, binarized, enc_name = _codec_buffers(program, plan, offloaded, encoded, value, buffers)
    buf = {t.id: t.buffer for t in tensors}
    last_forward: dict[int, int] = {}
    for op in ops:
        for t in op.inputs + [op.output]:
            last_forward[buf[t]] = op.index
    last_backward: dict[int, int] = {}  # buffer -> the last op (in backward order) whose backward reads it
    for op in ops:
        for b in program.backward_reads(op):
            last_backward[b] = min(last_backward.get(b, n), op.index)
    workspace: dict[tuple[int, str], str] = {}
    for i in range(n):
        for pass_, nbytes in zip(("fwd", "bwd"), op_workspace(program, plan, i)):
            if nbytes:
                name = workspace[(i, pass_)] = f"ws:{ops[i].name}:{pass_}"
                buffers[name] = Buffer(name, nbytes, "workspace")

    steps: list[tuple] = [("alloc", "labels"), ("alloc", "loss"), ("alloc", value[program.input])]
    for op in ops:
        out = tensors[op.output]
        if out.buffer == out.id:
            steps.append(("alloc", value[out.id]))
        steps += [("alloc", aux[(op.index, k)]) for k in op.aux]
        ws = workspace.get((op.index, "fwd"))
        steps += [("alloc", ws), ("fwd", op.index), ("free", ws)] if ws else [("fwd", op.index)]
        for b in dict.fromkeys(buf[t] for t in op.inputs):
            if last_forward[b] != op.index:
                continue
            if b in offloaded:
                steps.append(("offload", value[b]))
            elif b in encoded:
                steps += [("alloc", enc_name[b]), ("encode", value[b]), ("free", value[b])]
            elif b not in stashed:
                steps.append(("free", value[b]))
    # the loss: logits in, d(logits) out
    out_grad = grads.of_tensor[program.output]
    steps += [("alloc", "probs"), ("alloc", out_grad), ("loss",), ("free", "probs"), ("free", "labels")]
    if buf[program.output] not in stashed:
        steps.append(("free", value[program.output]))
    starts: dict[int, list[str]] = {}
    ends: dict[int, list[str]] = {}
    for name, (first, last, _) in grads.intervals.items():
        if name != out_grad:
            starts.setdefault(first, []).append(name)
        ends.setdefault(last, []).append(name)
    backward_ops = [i for i in range(n - 1, -1, -1) if needs[ops[i].output]]
    prefetched: set[int] = set()
    waited: set[int] = set()
    decoded: set[int] = set()
    for i in backward_ops:
        op = ops[i]
        step_index = n - i
        for name in plan.prefetch.get(op.name, []):
            b = by_name[name]
            prefetched.add(b)
            steps += [("alloc", value[b]), ("prefetch", value[b])]
        for b in program.backward_reads(op):
            if b in encoded and b not in decoded and value[b] not in binarized:
                decoded.add(b)
                steps += [("alloc", value[b]), ("decode", value[b]), ("free", enc_name[b])]
        for b in program.backward_reads(op):
            if b in offloaded and b not in waited:  # later readers are ordered after the first on compute
                if b not in prefetched:
                    raise ValueError(f"plan {plan.policy!r}: {tensors[b].name!r} is offloaded but never prefetched "
                                     f"before the backward of {op.name!r}")
                waited.add(b)
                steps.append(("wait", value[b]))
        steps += [("alloc", name) for name in starts.get(step_index, [])]
        ws = workspace.get((i, "bwd"))
        steps += [("alloc", ws), ("bwd", i), ("free", ws)] if ws else [("bwd", i)]
        steps += grads.acc_steps.get(i, [])
        steps += [("free", name) for name in ends.get(step_index, [])]
        steps += [("free", aux[(i, k)]) for k in op.aux]
        steps += [("free", enc_name[b] if value[b] in binarized else value[b]) for b in program.backward_reads(op)
                  if last_backward[b] == i]
    # buffers nothing reads in backward (saved state of layers whose backward does not run)
    steps += [("free", aux[(i, k)]) for i in range(n) if not needs[ops[i].output] for k in ops[i].aux]
    steps += [("update",), ("free", "loss")]
    return Schedule(
        persistent=persistent_buffers(program, optimizer_slots), buffers=buffers, steps=steps, value=value,
        grad={t.id: grads.of_tensor[t.id] for t in tensors if needs[t.id]}, aux=aux, acc=grads.acc,
        workspace=workspace, needs_grad=needs, backward_ops=backward_ops, codecs=codec_of,
        encoded={value[b]: enc_name[b] for b in encoded}, transfer=transfer, binarized=binarized,
    )


def _codec_buffers(program: Program, plan: Plan, offloaded: set[int], encoded: set[int], value: dict[int, str],
                   buffers: dict[str, Buffer]) -> tuple[dict[str, str], dict[str, int], set[str], dict[int, str]]:
    """Codecs of offloaded and encoded buffers: the buffers holding encodings on the device (sized at the
    plan's density where the size depends on the data), the bytes each offload is expected to move, and
    which encoded buffers are binarized for sign-only readers."""
    tensors = program.tensors
    codec_of: dict[str, str] = {}
    transfer: dict[str, int] = {}
    binarized: set[str] = set()
    enc_name: dict[int, str] = {}
    for b in sorted(offloaded | encoded):
        t = tensors[b]
        spec = plan.codecs.get(t.name)
        if spec is None:
            if b in encoded:
                raise ValueError(f"plan {plan.policy!r} encodes {t.name!r} but names no codec for it")
            continue
        codec = _codecs.get(spec)
        codec_of[value[b]] = codec.spec
        if b in offloaded:
            transfer[value[b]] = codec.encoded_nbytes(t.shape, "float32", plan.density)
            continue
        if codec.name == "binarize":
            if not program.sign_only(b):
                raise ValueError(f"plan {plan.policy!r} binarizes {t.name!r}, but the backward of "
                                 f"{', '.join(op.name for op in program.backward_readers(b))} needs more than its sign")
            binarized.add(value[b])
        enc_name[b] = f"enc:{value[b]}"
        buffers[enc_name[b]] = Buffer(enc_name[b], _codecs.stored_nbytes(codec, t.shape, plan.density), "encoded")
    return codec_of, transfer, binarized, enc_name


def lower_inference(program: Program, plan: Plan) -> Schedule:
    """Forward only, layer by layer: each buffer is freed after its last consumer (nothing is stashed)."""
    ops, tensors = program.ops, program.tensors
    buffers: dict[str, Buffer] = {}
    value = {t.id: f"fm:{tensors[t.buffer].name}" for t in tensors}
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

    alloc(value[program.input], tensors[program.input].nbytes, "feature_maps")
    for op in ops:
        out = tensors[op.output]
        if out.buffer == out.id:
            alloc(value[out.id], out.nbytes, "feature_maps")
        for k, nbytes in op.aux_nbytes.items():
            aux[(op.index, k)] = f"aux:{op.name}.{k}"
            alloc(aux[(op.index, k)], nbytes, "feature_maps")
        fwd_ws, _ = op_workspace(program, plan, op.index)
        if fwd_ws:
            workspace[(op.index, "fwd")] = f"ws:{op.name}:fwd"
            alloc(workspace[(op.index, "fwd")], fwd_ws, "workspace")
        steps.append(("fwd", op.index))
        if fwd_ws:
            steps.append(("free", workspace[(op.index, "fwd")]))
        for k in op.aux_nbytes:
            steps.append(("free", aux[(op.index, k)]))
        for name in dict.fromkeys(value[i] for i in op.inputs):
            if last_use[name] == op.index:
                steps.append(("free", name))
    steps.append(("free", value[program.output]))  # after the host's read of the logits, in stream order
    return Schedule(persistent=[], buffers=buffers, steps=steps, value=value, aux=aux, workspace=workspace)
