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

from typing import TYPE_CHECKING

from ..graph import Program
from .gradients import Gradients, gradients, needs_grad, param_temps
from .layerwise import lower_layerwise
from .pack import place
from .parts import (
    LABELS,
    LOSS,
    PROBS,
    allocate,
    uploads,
    buffer_keys,
    codec_info,
    decode_step,
    encode_step,
    offload_step,
    op_workspace,
    pass_algos,
    persistent_buffers,
    pinned_bytes,
    prefetch_step,
)
from .steps import (
    Accumulate,
    Alloc,
    Backward,
    Buffer,
    CopyOut,
    Forward,
    Free,
    Key,
    Kind,
    Loss,
    Schedule,
    Step,
    Update,
    Upload,
)

if TYPE_CHECKING:
    from ..policies.plan import Plan

# the pieces both lowerings share are in .parts; their names stay importable from here
__all__ = [
    "lower",
    "lower_inference",
    "persistent_buffers",
    "op_workspace",
    "codec_info",
    "offload_step",
    "prefetch_step",
    "encode_step",
    "decode_step",
    "pinned_bytes",
    "LABELS",
    "LOSS",
    "PROBS",
]


def lower(
    program: Program,
    plan: "Plan",
    optimizer_slots: tuple[str, ...] = ("momentum",),
    alignment: int = 256,
    packing: str = "auto",
    capacity: int | None = None,
    *,
    accumulate: bool = False,
    update: bool = True,
) -> Schedule:
    """The training step of ``plan``, every allocation placed in the arena (:func:`.pack.place`, with the
    ``packing`` strategy, for an arena of ``capacity`` bytes where given). A micro-batch of a step
    (``Plan.microbatch``): ``accumulate`` adds every weight gradient to what earlier micro-batches left (each
    through a temporary, as a shared parameter's), and without ``update`` the optimizer does not run."""
    if plan.allocation == "network":
        schedule = _lower_network(program, plan, optimizer_slots, alignment, accumulate, update)
    elif plan.allocation == "layer":
        schedule = lower_layerwise(program, plan, optimizer_slots, alignment, accumulate, update)
    else:
        raise ValueError(f"plan {plan.policy!r}: unknown allocation {plan.allocation!r}")
    return place(schedule, packing, capacity)


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
    return slot_of, [
        Buffer(Key(Kind.GRAD_SLOT, str(s)), nbytes, "gradient_maps") for s, (_, nbytes) in enumerate(slots)
    ]


def _lower_network(
    program: Program,
    plan: "Plan",
    optimizer_slots: tuple[str, ...],
    alignment: int,
    accumulate: bool = False,
    update: bool = True,
) -> Schedule:
    """Everything allocated up front and freed at the end; gradients share slots, one workspace for all."""
    ops, tensors = program.ops, program.tensors
    n = len(ops)
    needs = needs_grad(program)
    value, buffers, aux = buffer_keys(program)
    ws_bytes = max([max(op_workspace(program, plan, i)) for i in range(n)] + [0])
    ws = Key(Kind.WORKSPACE)
    if ws_bytes:
        buffers[ws] = Buffer(ws, ws_bytes, "workspace")
    grads = gradients(program, needs)
    slot_of, slot_buffers = _share_slots(grads)
    buffers.update((b.key, b) for b in slot_buffers)
    temps, adds, temp_buffers = param_temps(program, needs, accumulate)
    buffers.update(temp_buffers)
    steps: list[Step] = []
    sources = uploads(program, value)
    for buf in buffers.values():
        allocate(buf, sources, steps)
    for i in range(n):
        fwd_ws, _ = op_workspace(program, plan, i)
        steps.append(Forward(i, pass_algos(plan, program, i)[0], ws if fwd_ws else None))
    steps.append(Loss())
    backward_ops = [i for i in range(n - 1, -1, -1) if needs[ops[i].output]]
    for i in backward_ops:
        _, bwd_ws = op_workspace(program, plan, i)
        steps.append(Backward(i, pass_algos(plan, program, i)[1], ws if bwd_ws else None))
        steps += [Accumulate(a.tensor, slot_of[a.temp]) for a in grads.acc_steps.get(i, [])]
        steps += adds.get(i, [])
    if update:
        steps.append(Update())
    steps += [Free(key) for key in reversed(list(buffers))]
    return Schedule(
        program=program,
        persistent=persistent_buffers(program, optimizer_slots),
        steps=steps,
        value=value,
        grad={t.id: slot_of[grads.of_tensor[t.id]] for t in tensors if needs[t.id]},
        aux=aux,
        acc={k: slot_of[v] for k, v in grads.acc.items()},
        param_acc=temps,
        needs_grad=needs,
        alignment=alignment,
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
    steps: list[Step] = []
    for t in program.input_tensors:
        steps += [
            Alloc(Buffer(value[t], max(tensors[t].nbytes, 1), "feature_maps")),
            Upload(value[t], program.upload_source(t)),
        ]
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
        steps.append(Forward(op.index, pass_algos(plan, program, op.index)[0], ws))
        if op.index == len(ops) - 1:
            steps.append(CopyOut(value[program.output], program.output))
        if ws is not None:
            steps.append(Free(ws))
        steps += [Free(aux[(op.index, k)]) for k in op.aux_nbytes]
        steps += [Free(key) for key in dict.fromkeys(value[i] for i in op.inputs) if last_use[key] == op.index]
    steps.append(Free(value[program.output]))  # after the host's read of the logits, in stream order
    return Schedule(
        program=program, persistent=[], steps=steps, value=value, aux=aux, alignment=alignment, training=False
    )
