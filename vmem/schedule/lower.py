"""Lowering: a Program and a Plan become the exact steps of one training step (a :class:`Schedule`).

A pure function shared by the executor (which carries the steps out on a device) and the planner (which
replays them through the pool code without data), so that a plan's predicted peak is the peak the step
sees. Everything the executor needs is resolved here: the algorithm of each convolution pass, the codec
object and range of each encoded or offloaded buffer, the sync mode, the pinned bytes, uploads of the
batch, the copy of the logits. Every allocation's place in the arena is planned (:mod:`.pack`).

Two allocations: ``network`` (everything up front, freed at the end; gradient live ranges share slots,
one workspace serves every layer) and ``layer`` (every buffer allocated just before its first use and
released after its last; stashed buffers the plan offloads leave after their last forward use and come
back at the plan's prefetch points; encoded ones are kept as their encoding in between).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .. import codecs as _codecs
from ..codecs import transfer as _transfer
from ..graph import Program
from ..nn.base import physical
from .gradients import Gradients, gradients, needs_grad, param_temps
from .pack import place
from .steps import (Accumulate, Alloc, Backward, BnRange, Buffer, CopyOut, Decode, Encode, Forward, Free, Key, Kind,
                    Loss, Offload, Prefetch, Schedule, Step, Update, Upload)

if TYPE_CHECKING:
    from ..policies.plan import Plan

__all__ = ["lower", "lower_inference", "persistent_buffers", "op_workspace", "codec_info", "offload_step",
           "prefetch_step", "encode_step", "decode_step", "pinned_bytes"]

LABELS, PROBS, LOSS = Key(Kind.LABELS), Key(Kind.PROBS), Key(Kind.LOSS)


def _align(n: int, alignment: int) -> int:
    return -(-max(n, 1) // alignment) * alignment


def persistent_buffers(program: Program, optimizer_slots: tuple[str, ...]) -> list[Buffer]:
    """Weights (and non-trainable buffers such as running statistics), weight gradients, optimizer state."""
    out = []
    for op, k, spec in program.owned_params():
        key = f"{op.name}.{k}"
        nbytes = int(np.prod(spec.shape)) * program.itemsize
        out.append(Buffer(Key(Kind.WEIGHT, key), nbytes, "weights"))
        if spec.trainable:
            out.append(Buffer(Key(Kind.WEIGHT_GRAD, key), nbytes, "weight_grads"))
            for slot in optimizer_slots:
                out.append(Buffer(Key(Kind.OPT_STATE, key, slot), nbytes, "optimizer_state"))
    return out


def op_workspace(program: Program, plan: "Plan", op_index: int) -> tuple[int, int]:
    """(forward, backward) workspace bytes of an op under the plan's algorithms."""
    op = program.ops[op_index]
    if not op.algorithms:
        return 0, 0
    algos = plan.algos.get(op.name, {})
    fwd = op.workspace["forward"].get(algos.get("forward", ""), 0)
    bwd = max(op.workspace["backward_data"].get(algos.get("backward_data", ""), 0),
              op.workspace["backward_filter"].get(algos.get("backward_filter", ""), 0))
    return fwd, bwd


def _values(program: Program) -> tuple[dict[int, Key], dict[Key, Buffer], dict[tuple[int, str], Key]]:
    """Feature-map buffers (in-place layers share their input's), saved state, labels, probabilities, loss."""
    buffers: dict[Key, Buffer] = {}
    value = {}
    for t in program.tensors:
        value[t.id] = Key(Kind.VALUE, program.tensors[t.buffer].name)
        if t.buffer == t.id:
            buffers[value[t.id]] = Buffer(value[t.id], max(t.nbytes, 1), "feature_maps")
    aux = {}
    for op in program.ops:
        for k, nbytes in op.aux_nbytes.items():
            aux[(op.index, k)] = key = Key(Kind.AUX, op.name, k)
            buffers[key] = Buffer(key, max(nbytes, 1), "feature_maps", high=True)
    labels = int(np.prod(program.label_shape))
    for key, nbytes, category in ((LABELS, labels * 8, "other"),
                                  (PROBS, labels * program.num_classes * program.itemsize, "feature_maps"),
                                  (LOSS, program.itemsize, "other")):
        buffers[key] = Buffer(key, nbytes, category, high=True)
    return value, buffers, aux


def _algos(plan: "Plan", program: Program, i: int) -> tuple[Any, tuple[Any, Any]]:
    per = plan.algos.get(program.ops[i].name, {})
    return per.get("forward"), (per.get("backward_data"), per.get("backward_filter"))


def _alloc(buffer: Buffer, input_key: Key, steps: list[Step]) -> None:
    """Allocate ``buffer``; the input's and the labels' buffers are filled from the batch at once."""
    steps.append(Alloc(buffer))
    if buffer.key == input_key:
        steps.append(Upload(buffer.key, "input"))
    elif buffer.key == LABELS:
        steps.append(Upload(buffer.key, "labels"))


def lower(program: Program, plan: "Plan", optimizer_slots: tuple[str, ...] = ("momentum",),
          alignment: int = 256) -> Schedule:
    """The training step of ``plan``, every allocation placed in the arena (:func:`.pack.place`)."""
    if plan.allocation == "network":
        schedule = _lower_network(program, plan, optimizer_slots, alignment)
    elif plan.allocation == "layer":
        from .layerwise import lower_layerwise

        schedule = lower_layerwise(program, plan, optimizer_slots, alignment)
    else:
        raise ValueError(f"plan {plan.policy!r}: unknown allocation {plan.allocation!r}")
    return place(schedule)


def _share_slots(grads: Gradients) -> tuple[dict[Key, Key], list[Buffer]]:
    """Gradient live ranges packed into shared slots (a dX/dY pair for a chain), tightest size first."""
    slots: list[list[int]] = []  # [free after step, nbytes]
    slot_of: dict[Key, Key] = {}
    for key, (start, end, nbytes) in sorted(grads.intervals.items(), key=lambda kv: (kv[1][0], kv[1][1], str(kv[0]))):
        free = [s for s in range(len(slots)) if slots[s][0] < start]
        if free:
            s = min(free, key=lambda s: (abs(slots[s][1] - nbytes), s))
            slots[s] = [end, max(slots[s][1], nbytes)]
        else:
            slots.append([end, nbytes])
            s = len(slots) - 1
        slot_of[key] = Key(Kind.GRAD_SLOT, str(s))
    return slot_of, [Buffer(Key(Kind.GRAD_SLOT, str(s)), nbytes, "gradient_maps") for s, (_, nbytes) in enumerate(slots)]


def _lower_network(program: Program, plan: "Plan", optimizer_slots: tuple[str, ...], alignment: int) -> Schedule:
    """Everything allocated up front and freed at the end; gradients share slots, one workspace for all."""
    ops, tensors = program.ops, program.tensors
    n = len(ops)
    needs = needs_grad(program)
    value, buffers, aux = _values(program)
    ws_bytes = max([max(op_workspace(program, plan, i)) for i in range(n)] + [0])
    ws = Key(Kind.WORKSPACE)
    if ws_bytes:
        buffers[ws] = Buffer(ws, ws_bytes, "workspace")
    grads = gradients(program, needs)
    slot_of, slot_buffers = _share_slots(grads)
    buffers.update((b.key, b) for b in slot_buffers)
    temps, adds, temp_buffers = param_temps(program, needs)
    buffers.update(temp_buffers)
    steps: list[Step] = []
    for buf in buffers.values():
        _alloc(buf, value[program.input], steps)
    for i in range(n):
        fwd_ws, _ = op_workspace(program, plan, i)
        steps.append(Forward(i, _algos(plan, program, i)[0], ws if fwd_ws else None))
    steps.append(Loss())
    backward_ops = [i for i in range(n - 1, -1, -1) if needs[ops[i].output]]
    for i in backward_ops:
        _, bwd_ws = op_workspace(program, plan, i)
        steps.append(Backward(i, _algos(plan, program, i)[1], ws if bwd_ws else None))
        steps += [Accumulate(a.tensor, slot_of[a.temp]) for a in grads.acc_steps.get(i, [])]
        steps += adds.get(i, [])
    steps.append(Update())
    steps += [Free(key) for key in reversed(list(buffers))]
    return Schedule(
        program=program, persistent=persistent_buffers(program, optimizer_slots), steps=steps, value=value,
        grad={t.id: slot_of[grads.of_tensor[t.id]] for t in tensors if needs[t.id]}, aux=aux,
        acc={k: slot_of[v] for k, v in grads.acc.items()}, param_acc=temps, needs_grad=needs, alignment=alignment,
    )


def lower_inference(program: Program, plan: "Plan", alignment: int = 256) -> Schedule:
    """Forward only, layer by layer: each buffer is freed after its last consumer (nothing is stashed);
    the logits are copied to the host after the last op. Blocks are placed online by the pool."""
    ops, tensors = program.ops, program.tensors
    value = {t.id: Key(Kind.VALUE, tensors[t.buffer].name) for t in tensors}
    last_use: dict[Key, int] = {}  # last op reading each buffer (through any tensor aliasing it)
    for op in ops:
        for i in op.inputs + [op.output]:
            last_use[value[i]] = op.index
    last_use[value[program.output]] = len(ops)  # read by the host after the last op
    steps: list[Step] = [Alloc(Buffer(value[program.input], max(tensors[program.input].nbytes, 1), "feature_maps")),
                         Upload(value[program.input], "input")]
    aux = {}
    for op in ops:
        out = tensors[op.output]
        if out.buffer == out.id:
            steps.append(Alloc(Buffer(value[out.id], max(out.nbytes, 1), "feature_maps")))
        for k, nbytes in op.aux_nbytes.items():
            aux[(op.index, k)] = Key(Kind.AUX, op.name, k)
            steps.append(Alloc(Buffer(aux[(op.index, k)], max(nbytes, 1), "feature_maps")))
        fwd_ws, _ = op_workspace(program, plan, op.index)
        ws = Key(Kind.WORKSPACE, op.name, "fwd") if fwd_ws else None
        if ws is not None:
            steps.append(Alloc(Buffer(ws, fwd_ws, "workspace")))
        steps.append(Forward(op.index, _algos(plan, program, op.index)[0], ws))
        if op.index == len(ops) - 1:
            steps.append(CopyOut(value[program.output], program.output))
        if ws is not None:
            steps.append(Free(ws))
        steps += [Free(aux[(op.index, k)]) for k in op.aux_nbytes]
        steps += [Free(key) for key in dict.fromkeys(value[i] for i in op.inputs) if last_use[key] == op.index]
    steps.append(Free(value[program.output]))  # after the host's read of the logits, in stream order
    return Schedule(program=program, persistent=[], steps=steps, value=value, aux=aux, alignment=alignment,
                    training=False)


def codec_info(program: Program, plan: "Plan", offloaded: set[int], encoded: set[int]) -> dict[int, Any]:
    """Per offloaded or encoded buffer with a codec: (codec, bytes on the bus or stored encoding bytes,
    binarized, batch-norm range). Raises for a plan that encodes without a codec or binarizes a buffer
    whose backward readers need more than its sign."""
    tensors = program.tensors
    index = {op.name: op.index for op in program.ops}
    out: dict[int, Any] = {}
    for b in sorted(offloaded | encoded):
        t = tensors[b]
        spec = plan.codecs.get(t.name)
        if spec is None:
            if b in encoded:
                raise ValueError(f"plan {plan.policy!r} encodes {t.name!r} but names no codec for it")
            continue
        codec = _codecs.get(spec)
        r = plan.ranges.get(t.name)
        bn = BnRange(index[r["batchnorm"]], bool(r["relu"]), float(r["sigmas"])) if r else None
        if b in offloaded:
            out[b] = (codec, codec.encoded_nbytes(t.shape, "float32", plan.density), False, bn)
            continue
        if codec.sign_only and not program.sign_only(b):
            raise ValueError(f"plan {plan.policy!r} binarizes {t.name!r}, but the backward of "
                             f"{', '.join(op.name for op in program.backward_readers(b))} needs more than its sign")
        out[b] = (codec, _codecs.stored_nbytes(codec, t.shape, plan.density), codec.sign_only, bn)
    return out


def offload_step(program: Program, b: int, key: Key, nbytes: int, codec_info: Any) -> Offload:
    """The Offload of buffer ``b`` (owner tensor id) under its codec, if any."""
    t = program.tensors[b]
    if codec_info is None:
        return Offload(key, nbytes, nbytes, physical(t.shape))
    codec, transfer_nbytes, _, bn = codec_info
    return Offload(key, _transfer.host_nbytes(codec, t.shape), transfer_nbytes, physical(t.shape), codec, bn)


def prefetch_step(program: Program, b: int, key: Key, nbytes: int, codec_info: Any) -> Prefetch:
    t = program.tensors[b]
    if codec_info is None:
        return Prefetch(key, nbytes, physical(t.shape))
    return Prefetch(key, codec_info[1], physical(t.shape), codec_info[0])


def encode_step(program: Program, b: int, key: Key, enc: Key, codec_info: Any) -> Encode:
    t = program.tensors[b]
    codec, _, _, bn = codec_info
    return Encode(key, enc, codec, physical(t.shape), max(t.nbytes, 1), bn)


def decode_step(program: Program, b: int, key: Key, enc: Key, codec_info: Any) -> Decode:
    t = program.tensors[b]
    return Decode(key, enc, codec_info[0], physical(t.shape), max(t.nbytes, 1))


def pinned_bytes(steps: list[Step], alignment: int) -> int:
    """Pinned host bytes the step's offloads need at once, each at the pool's alignment."""
    return sum(_align(st.host_nbytes, alignment) for st in steps if type(st) is Offload)

