"""Layer-wise lowering (vDNN, Gist, Echo): every buffer is allocated just before its first use and released
after its last; stashed buffers the plan offloads leave after their last forward use and come back at the
prefetch points the plan names; encoded ones are kept as their encoding in between (binarized ones are
never decoded: ReLU's backward reads the bits); recomputed ones are freed after their last forward use and
rebuilt before their first backward use (:mod:`.recompute`: the walk, its sources and its errors).

When an offload starts (vDNN's overlap). A buffer is copied to the host once it holds what backward will
read: right after the last op that writes it (an in-place layer writes over its input, so a ReLU after a
convolution is that last writer; the network's input, after its upload). From then on only the forward of
its readers touches it, and they only read it, so the copy overlaps them; no forward ever writes a buffer
while it is being copied, which is why an in-place layer never has to wait for one. At the end of the last
reader the buffer is released (:class:`~vmem.schedule.steps.Release`): with ``sync="layer"`` the compute
stream waits for the copy there, with ``sync="event"`` the block is freed once the copy's event completes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from .. import codecs as _codecs
from ..errors import PlanError
from ..graph import Program
from .gradients import gradients, needs_grad, param_temps
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
    split_workspace,
    pass_algos,
    persistent_buffers,
    pinned_bytes,
    prefetch_step,
)
from ..graph.backward import Rebuild, backward_uses, check_sources, decisions
from .steps import (
    Alloc,
    Backward,
    Buffer,
    Forward,
    Free,
    Key,
    Kind,
    Loss,
    Offload,
    Prefetch,
    Recompute,
    Release,
    Schedule,
    Step,
    Update,
    WaitPrefetch,
)

if TYPE_CHECKING:
    from ..policies.plan import Plan

__all__ = ["lower_layerwise"]

#: the encoding a split convolution's input keeps for a later ReLU's backward (Gist's binarize: its sign)
_BITS = _codecs.get("binarize")


class _Sign(NamedTuple):
    """The sign bits of a split convolution's input that a later ReLU's backward reads: their key, the walk
    positions of the split (where they are made) and of their first and last readers, and whether they wait
    on the host in between (``Plan.signs``)."""

    key: Key
    split: int
    first: int
    last: int
    host: bool
    nbytes: int


class _Layerwise:
    """The state of one layer-wise lowering; ``forward``, ``loss`` and ``backward`` append the steps."""

    def __init__(self, program: Program, plan: "Plan", accumulate: bool = False, update: bool = True):
        self.program, self.plan, self.update = program, plan, update
        ops, tensors = program.ops, program.tensors
        self.needs = needs_grad(program)
        self.value, self.buffers, self.aux = buffer_keys(program)
        self._sources = uploads(program, self.value)  # what is filled from the batch (once: see alloc)
        self.grads = gradients(program, self.needs)
        self.param_temps, self.param_adds, temp_buffers = param_temps(program, self.needs, accumulate)
        for key, (_, _, nbytes) in self.grads.intervals.items():
            self.buffers[key] = Buffer(key, max(nbytes, 1), "gradient_maps")
        self.buffers.update(temp_buffers)
        self.decided = decisions(program, plan.stash)
        check_sources(program, self.decided)
        self.offloaded = {b for b, d in self.decided.items() if d == "offload"}
        self.encoded = {b for b, d in self.decided.items() if d == "encode"}
        self.codecs = codec_info(program, plan, self.offloaded, self.encoded)
        self.enc = {b: Key(Kind.ENCODED, tensors[b].name) for b in self.encoded}
        for b, key in self.enc.items():
            self.buffers[key] = Buffer(key, self.codecs[b][1], "encoded")
        self.binarized = {b for b in self.encoded if self.codecs[b][2]}
        lossless = {b for b in self.encoded if self.codecs[b][0].lossless and not self.codecs[b][2]}
        self.walk = backward_uses(program, self.decided, self.needs, lossless)
        self.last_use: dict[int, tuple[int, int]] = {}  # buffer -> (walk position, rebuild index or -1: its backward)
        for pos, uses in enumerate(self.walk):
            for k, rebuild in enumerate(uses.rebuilds):
                for src in rebuild.sources:
                    self.last_use[src] = (pos, k)
            for b in uses.reads:
                self.last_use[b] = (pos, -1)
        self.buf, self.last_forward, self.last_writer = program.derived("layerwise", lambda: _positions(program))
        self.released = self._released()
        #: convolutions whose backward runs as two steps (Plan.split): those whose input needs a gradient
        #: (else there is no second step) and that compute as stored (a staged op's copies span its backward)
        self.split = {
            op.index
            for op in ops
            if op.name in plan.split and op.kind == "conv" and not op.staged and self.needs[op.inputs[0]]
        }
        self.walk_pos = {uses.op: pos for pos, uses in enumerate(self.walk)}
        self.signs = self._signs()
        self.workspace: dict[tuple[int, str], Key] = {}
        for i in range(len(ops)):
            sizes = dict(zip(("fwd", "bwd"), op_workspace(program, plan, i)))
            if i in self.split:  # each part its own pass's workspace
                del sizes["bwd"]
                sizes.update(zip(("filter", "data"), split_workspace(program, plan, i)))
            for pass_, nbytes in sizes.items():
                if nbytes:
                    key = self.workspace[(i, pass_)] = Key(Kind.WORKSPACE, ops[i].name, pass_)
                    self.buffers[key] = Buffer(key, nbytes, "workspace")
        self.loss_inplace = self._loss_inplace()
        if self.loss_inplace:  # d(logits) lives in the logits' buffer: one key for both
            out_grad = self.grads.of_tensor[program.output]
            logits = self.value[program.output]
            self.grads.intervals[logits] = self.grads.intervals.pop(out_grad)
            for t, key in self.grads.of_tensor.items():
                if key == out_grad:
                    self.grads.of_tensor[t] = logits
            del self.buffers[out_grad]
        self.steps: list[Step] = []

    def _released(self) -> dict[int, int]:
        """Offloaded buffer -> the op after whose forward it is released: its last forward reader, or the
        later op the plan names (``Plan.release``: its block held until its copy is expected to end)."""
        program, plan = self.program, self.plan
        ids = {t.name: t.id for t in program.tensors}
        index = {op.name: op.index for op in program.ops}
        out = {b: self.last_forward[b] for b in self.offloaded}
        for name, op_name in plan.release.items():
            b = ids.get(name)
            if b is None or b not in self.offloaded:
                raise PlanError(f"plan {plan.policy!r}: release names {name!r}, which the plan does not offload")
            if op_name not in index:
                raise PlanError(f"plan {plan.policy!r}: release of {name!r} after {op_name!r}, which is no layer")
            out[b] = max(out[b], index[op_name])
        return out

    def _loss_inplace(self) -> bool:
        """Whether the loss may write the probabilities and d(logits) over the logits: nothing sharing their
        buffer is read by a backward or kept for the plan, and no other gradient shares it."""
        program = self.program
        b = self.buf[program.output]
        if b in self.decided:  # every stashed buffer has a decision, and so has every source of a rebuild
            return False
        if program.tensors[program.output].dtype != program.loss_dtype:  # half logits: the loss works in float32
            return False
        out_grad = self.grads.of_tensor.get(program.output)
        group = [t for t, key in self.grads.of_tensor.items() if key == out_grad]
        return out_grad is not None and all(program.tensors[t].buffer == b for t in group)

    def alloc(self, key: Key) -> None:
        allocate(self.buffers[key], self._sources, self.steps)
        # filled from the batch once: allocated again (an offloaded input, for its prefetch), it is not
        self._sources.pop(key, None)

    def alloc_encoding(self, b: int) -> None:
        self.steps.append(Alloc(self.buffers[self.enc[b]]))

    def around_workspace(self, i: int, pass_: str, step: Step) -> None:
        ws = self.workspace.get((i, pass_))
        self.steps += [Alloc(self.buffers[ws]), step, Free(ws)] if ws else [step]

    def start_offload(self, b: int) -> None:
        if b in self.offloaded:
            self.steps.append(
                offload_step(self.program, b, self.value[b], self.buffers[self.value[b]].nbytes, self.codecs.get(b))
            )

    def forward(self) -> None:
        program, value = self.program, self.value
        for key in (LABELS, LOSS, *(value[t] for t in program.input_tensors)):
            self.alloc(key)
        for t in program.input_tensors:
            self.start_offload(self.buf[t])  # written by its upload
        held: dict[int, list[int]] = {}  # op -> offloaded buffers released after its forward (Plan.release)
        for op in program.ops:
            out = program.tensors[op.output]
            if out.buffer == out.id:
                self.alloc(value[out.id])
            for k in op.aux:
                self.alloc(self.aux[(op.index, k)])
            ws = self.workspace.get((op.index, "fwd"))
            self.around_workspace(op.index, "fwd", Forward(op.index, pass_algos(self.plan, program, op.index)[0], ws))
            if self.last_writer[self.buf[op.output]] == op.index:
                self.start_offload(self.buf[op.output])
                if self.buf[op.output] in self.signs and self.signs[self.buf[op.output]].host:
                    self.make_sign(self.buf[op.output])
            for b in held.pop(op.index, []):
                self.steps.append(Release(value[b], self.plan.sync or "layer"))
            for b in dict.fromkeys(self.buf[t] for t in op.inputs):
                if self.last_forward[b] != op.index:
                    continue
                if b in self.offloaded:
                    if self.released[b] == op.index:
                        self.steps.append(Release(value[b], self.plan.sync or "layer"))
                    else:  # its copy is expected to run past this op: released after a later one
                        held.setdefault(self.released[b], []).append(b)
                elif b in self.encoded:
                    self.alloc_encoding(b)
                    self.steps += [encode_step(program, b, value[b], self.enc[b], self.codecs[b]), Free(value[b])]
                elif self.decided.get(b) != "keep":  # not stashed, or recomputed in backward
                    self.steps.append(Free(value[b]))

    def loss(self) -> None:
        """The loss: logits in, d(logits) out."""
        program = self.program
        if self.loss_inplace:  # the logits' buffer becomes d(logits), freed with it in backward
            self.steps += [Loss(inplace=True), Free(LABELS)]
            return
        self.alloc(PROBS)
        self.alloc(self.grads.of_tensor[program.output])
        self.steps += [Loss(), Free(PROBS), Free(LABELS)]
        if self.decided.get(self.buf[program.output]) in (None, "recompute"):
            self.steps.append(Free(self.value[program.output]))

    def backward(self) -> None:
        program, plan, value = self.program, self.plan, self.value
        ops, n = program.ops, len(program.ops)
        out_grad = self.grads.of_tensor[program.output]
        starts: dict[int, list[Key]] = {}
        ends: dict[int, list[Key]] = {}
        for key, (first, last, _) in self.grads.intervals.items():
            if key != out_grad:
                starts.setdefault(first, []).append(key)
            ends.setdefault(last, []).append(key)
        by_name = {t.name: t.id for t in program.tensors}
        prefetched: set[int] = set()
        ready: set[int] = set()
        for pos, uses in enumerate(self.walk):
            i = uses.op
            op = ops[i]
            for name in plan.prefetch.get(op.name, []):
                b = by_name[name]
                prefetched.add(b)
                self.alloc(value[b])
                self.steps.append(
                    prefetch_step(program, b, value[b], self.buffers[value[b]].nbytes, self.codecs.get(b))
                )
            for k, rebuild in enumerate(uses.rebuilds):
                self.rebuild(rebuild, prefetched, ready, (pos, k))
            self.bring_back(op, uses.reads, prefetched, ready)
            for sign in self.signs.values():
                if sign.host and sign.first == pos:  # bits sent to the host at the split: back for their reader
                    self.steps += [Alloc(self.buffers[sign.key]), Prefetch(sign.key, sign.nbytes, (sign.nbytes,))]
                    self.steps.append(WaitPrefetch(sign.key))
            read_last = [
                Free(self.enc[b] if b in self.binarized else value[b])
                for b in uses.reads
                if self.last_use[b] == (pos, -1)
            ]
            split = i in self.split
            if not split:
                for key in starts.get(n - i, []):
                    self.alloc(key)
            temps = list(self.param_temps.get(i, {}).values())
            for key in temps:
                self.alloc(key)
            if split:  # the weights' gradients, the input freed, then its gradient: x + dy, then dy + dx
                self.around_workspace(i, "filter", self.backward_step(i, "filter"))
                self.steps += self.param_adds.get(i, []) + [Free(key) for key in temps]
                for b in uses.reads:
                    if b in self.signs and self.signs[b].split == pos and not self.signs[b].host:
                        self.make_sign(b)  # a ReLU reads its sign later: as bits
                self.steps += read_last
                for key in starts.get(n - i, []):
                    self.alloc(key)
                self.around_workspace(i, "data", self.backward_step(i, "data"))
            else:
                self.around_workspace(i, "bwd", self.backward_step(i))
                self.steps += self.param_adds.get(i, []) + [Free(key) for key in temps]
            self.steps += self.grads.acc_steps.get(i, [])
            self.steps += [Free(key) for key in ends.get(n - i, [])]
            self.steps += [Free(self.aux[(i, k)]) for k in op.aux]
            if not split:
                self.steps += read_last
            self.steps += [Free(sign.key) for sign in self.signs.values() if sign.last == pos]
        # saved state of layers whose backward does not run
        self.steps += [Free(self.aux[(i, k)]) for i in range(n) if not self.needs[ops[i].output] for k in ops[i].aux]
        self.steps += [Free(key) for key in self.still_allocated() if key != LOSS]  # held but never read back
        self.steps += ([Update()] if self.update else []) + [Free(LOSS)]

    def _signs(self) -> dict[int, _Sign]:
        """Inputs of split convolutions that later backwards read only for their sign (a ReLU's output, read
        again by the ReLU's own backward): per buffer, its bits' key and where they are made and read. Their
        bits are encoded once the filters' gradient is made, so that the values are freed there, as if the
        convolution were their last reader; those the plan names (``Plan.signs``) go to the host until their
        first reader."""
        program, ops = self.program, self.program.ops
        out: dict[int, _Sign] = {}
        host = set(self.plan.signs)
        positions = self.walk_pos
        for i in sorted(self.split, key=lambda i: positions.get(i, -1)):
            if i not in positions:
                continue
            pos, x = positions[i], program.tensors[ops[i].inputs[0]].buffer
            last = self.last_use.get(x)
            if last is None or last == (pos, -1) or x in out or x in self.binarized:
                continue
            later = [p for p, uses in enumerate(self.walk) if p > pos and x in uses.reads]
            rebuilt_from = any(x in r.sources for uses in self.walk[pos + 1 :] for r in uses.rebuilds)
            sign_readers = all(
                self.buf[ops[self.walk[p].op].output] == x
                and not ops[self.walk[p].op].reads_input
                and ops[self.walk[p].op].layer.needs == frozenset({"mask"})
                for p in later
            )
            if later and sign_readers and not rebuilt_from and last == (later[-1], -1):
                key = Key(Kind.ENCODED, program.tensors[x].name, "sign")
                t = program.tensors[x]
                self.buffers[key] = Buffer(key, _codecs.stored_nbytes(_BITS, t.shape, 0.5, t.dtype), "encoded")
                out[x] = _Sign(key, pos, later[0], later[-1], t.name in host, self.buffers[key].nbytes)
                self.last_use[x] = (pos, -1)
        return out

    def make_sign(self, b: int) -> None:
        """The sign bits of a split convolution's input ``b``: made at the split, between its two steps
        (the values are freed next), or, where they wait on the host, in the forward, once the values are
        written for the last time (made at the split, they would be a third map beside x and dy), sent to the
        host and their block released once the copy is done."""
        sign = self.signs[b]
        self.alloc(sign.key)
        info = (_BITS, sign.nbytes, True, None)
        self.steps.append(encode_step(self.program, b, self.value[b], sign.key, info))
        if sign.host:
            self.steps += [
                Offload(sign.key, sign.nbytes, sign.nbytes, (sign.nbytes,)),
                Release(sign.key, self.plan.sync or "layer"),
            ]

    def still_allocated(self) -> list[Key]:
        live: dict[Key, None] = {}
        for st in self.steps:
            if type(st) is Alloc:
                live[st.buffer.key] = None
            elif type(st) in (Free, Release):
                live.pop(st.key, None)  # type: ignore[union-attr]
        return list(live)

    def bring_back(
        self, op: Any, reads: tuple[int, ...], prefetched: set[int], ready: set[int], reader: str | None = None
    ) -> None:
        """Before ``op``'s backward (or a rebuild, ``reader``): decode what it reads that is encoded, wait for
        what is prefetched."""
        program, value = self.program, self.value
        for b in reads:
            if b in self.encoded and b not in ready and b not in self.binarized:
                ready.add(b)
                self.alloc(value[b])
                self.steps += [decode_step(program, b, value[b], self.enc[b], self.codecs[b]), Free(self.enc[b])]
        for b in reads:
            if b in self.offloaded and b not in ready:  # later readers are ordered after the first on compute
                if b not in prefetched:
                    raise ValueError(
                        f"plan {self.plan.policy!r}: {program.tensors[b].name!r} is offloaded but never "
                        f"prefetched before {reader or f'the backward of {op.name!r}'}"
                    )
                ready.add(b)
                self.steps.append(WaitPrefetch(value[b]))

    def rebuild(self, rebuild: Rebuild, prefetched: set[int], ready: set[int], at: tuple[int, int]) -> None:
        """Run the ops that write a recomputed buffer again, from its live sources; free the sources whose
        last use this is."""
        program, value = self.program, self.value
        b = rebuild.buffer
        producer = program.ops[rebuild.chain[0]]
        self.bring_back(
            producer, rebuild.sources, prefetched, ready, reader=f"the rebuild of {program.tensors[b].name!r}"
        )
        self.alloc(value[b])
        for j in rebuild.chain:
            ws = self.workspace.get((j, "fwd"))
            self.around_workspace(j, "fwd", Recompute(j, pass_algos(self.plan, program, j)[0], ws))
        self.steps += [Free(value[s]) for s in rebuild.sources if self.last_use[s] == at]

    def backward_step(self, i: int, part: str = "all") -> Backward:
        op = self.program.ops[i]
        out = self.buf[op.output]
        on_bits = self.enc[out] if op.reads_output and out in self.binarized else None
        if op.reads_output and out in self.signs and self.walk_pos[i] > self.signs[out].split:
            on_bits = self.signs[out].key  # its values were freed after a split convolution read them
        ws = self.workspace.get((i, "bwd" if part == "all" else part))
        return Backward(i, pass_algos(self.plan, self.program, i)[1], ws, on_bits, part)


def _positions(program: Program) -> tuple[dict[int, int], dict[int, int], dict[int, int]]:
    """Per tensor its buffer; per buffer the last op whose forward touches it (the loss, ``len(ops)``, for
    the logits' buffer) and the last op writing it. Of the program alone: made once, shared."""
    ops = program.ops
    buf = {t.id: t.buffer for t in program.tensors}
    last_forward: dict[int, int] = {}
    for op in ops:
        for t in op.inputs + [op.output]:
            last_forward[buf[t]] = op.index
    # the loss reads the logits (their buffer may be an earlier op's, written over in place by a last Flatten)
    last_forward[buf[program.output]] = len(ops)
    last_writer = {buf[op.output]: op.index for op in ops}
    return buf, last_forward, last_writer


def lower_layerwise(
    program: Program,
    plan: "Plan",
    optimizer_slots: tuple[str, ...],
    alignment: int,
    accumulate: bool = False,
    update: bool = True,
) -> Schedule:
    lowering = _Layerwise(program, plan, accumulate, update)
    lowering.forward()
    lowering.loss()
    lowering.backward()
    grads, needs = lowering.grads, lowering.needs
    return Schedule(
        program=program,
        persistent=persistent_buffers(program, optimizer_slots),
        steps=lowering.steps,
        value=lowering.value,
        grad={t.id: grads.of_tensor[t.id] for t in program.tensors if needs[t.id]},
        aux=lowering.aux,
        acc=grads.acc,
        param_acc=lowering.param_temps,
        needs_grad=needs,
        alignment=alignment,
        pinned_bytes=pinned_bytes(lowering.steps, alignment),
    )
