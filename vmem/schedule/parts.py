"""The pieces both lowerings build a Schedule from (:mod:`.lower` for network-wide allocation and
inference, :mod:`.layerwise` for layer-wise allocation): the persistent buffers, every tensor's buffer key,
the algorithms and workspace of an op under a plan, the allocation steps, and the offload, prefetch,
encode and decode steps of a buffer with its codec."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .. import codecs as _codecs
from ..codecs import transfer as _transfer
from ..errors import PlanError
from ..graph import Program
from ..nn.base import physical
from .steps import Alloc, BnRange, Buffer, Decode, Encode, Key, Kind, Offload, Prefetch, Step, Upload

if TYPE_CHECKING:
    from ..policies.plan import Plan

__all__ = [
    "LABELS",
    "PROBS",
    "LOSS",
    "persistent_buffers",
    "op_workspace",
    "split_workspace",
    "buffer_keys",
    "pass_algos",
    "allocate",
    "codec_info",
    "offload_step",
    "prefetch_step",
    "encode_step",
    "decode_step",
    "pinned_bytes",
]

LABELS, PROBS, LOSS = Key(Kind.LABELS), Key(Kind.PROBS), Key(Kind.LOSS)


def _align(n: int, alignment: int) -> int:
    return -(-max(n, 1) // alignment) * alignment


def persistent_buffers(program: Program, optimizer_slots: tuple[str, ...]) -> list[Buffer]:
    """Weights (and non-trainable buffers such as running statistics), weight gradients, optimizer state."""
    return list(program.derived(("persistent", tuple(optimizer_slots)), lambda: _persistent(program, optimizer_slots)))


def _persistent(program: Program, optimizer_slots: tuple[str, ...]) -> list[Buffer]:
    out = []
    precision = program.precision
    for op, k, spec in program.owned_params():
        key = f"{op.name}.{k}"
        n = int(np.prod(spec.shape))
        out.append(Buffer(Key(Kind.WEIGHT, key), n * precision.itemsize("parameters"), "weights"))
        if spec.trainable:
            out.append(Buffer(Key(Kind.WEIGHT_GRAD, key), n * precision.itemsize("gradients"), "weight_grads"))
            for slot in optimizer_slots:
                state = n * precision.itemsize("optimizer_state")
                out.append(Buffer(Key(Kind.OPT_STATE, key, slot), state, "optimizer_state"))
    return out


def op_workspace(program: Program, plan: "Plan", op_index: int) -> tuple[int, int]:
    """(forward, backward) workspace bytes of an op under the plan's algorithms."""
    op = program.ops[op_index]
    algos = plan.algos.get(op.name, {}) if op.algorithms else {}  # an op with no choice: its entry under None
    fwd = op.workspace["forward"].get(algos.get("forward"), 0)
    bwd = max(
        op.workspace["backward_data"].get(algos.get("backward_data"), 0),
        op.workspace["backward_filter"].get(algos.get("backward_filter"), 0),
    )
    return fwd, bwd


def split_workspace(program: Program, plan: "Plan", op_index: int) -> tuple[int, int]:
    """(backward-filter, backward-data) workspace bytes of a convolution under the plan's algorithms: what
    each step of a split backward (``Plan.split``) holds."""
    op = program.ops[op_index]
    algos = plan.algos.get(op.name, {}) if op.algorithms else {}
    return (
        op.workspace["backward_filter"].get(algos.get("backward_filter"), 0),
        op.workspace["backward_data"].get(algos.get("backward_data"), 0),
    )


def buffer_keys(program: Program) -> tuple[dict[int, Key], dict[Key, Buffer], dict[tuple[int, str], Key]]:
    """Feature-map buffers (in-place layers share their input's), saved state, labels, probabilities, loss:
    per tensor its buffer's key, per key its Buffer (a fresh dict, for the lowering to add to), per saved
    state its key."""
    value, buffers, aux = program.derived("buffer_keys", lambda: _buffer_keys(program))
    return value, dict(buffers), aux


def _buffer_keys(program: Program) -> tuple[dict[int, Key], dict[Key, Buffer], dict[tuple[int, str], Key]]:
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
    loss = np.dtype(program.loss_dtype).itemsize  # the loss is computed in the network's dtype (float32 under fp16)
    for key, nbytes, category in (
        (LABELS, labels * 8, "other"),
        (PROBS, labels * program.num_classes * loss, "feature_maps"),
        (LOSS, loss, "other"),
    ):
        buffers[key] = Buffer(key, nbytes, category, high=True)
    return value, buffers, aux


def pass_algos(plan: "Plan", program: Program, i: int) -> tuple[Any, tuple[Any, Any]]:
    per = plan.algos.get(program.ops[i].name, {})
    return per.get("forward"), (per.get("backward_data"), per.get("backward_filter"))


def uploads(program: Program, value: dict[int, Key]) -> dict[Key, str]:
    """The buffers filled from the batch as they are allocated: each input's (by its upload source, see
    :meth:`Program.upload_source`) and the labels'."""
    out = {value[t]: program.upload_source(t) for t in program.input_tensors}
    out[LABELS] = "labels"
    return out


def allocate(buffer: Buffer, sources: dict[Key, str], steps: list[Step]) -> None:
    """Allocate ``buffer``; the inputs' and the labels' buffers (``sources``, see :func:`uploads`) are filled
    from the batch at once."""
    steps.append(Alloc(buffer))
    if buffer.key in sources:
        steps.append(Upload(buffer.key, sources[buffer.key]))


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
        if t.dtype not in ("float32", "float16", "bfloat16"):
            raise PlanError(
                f"plan {plan.policy!r}: codec {spec!r} encodes float32, float16 or bfloat16 feature maps; "
                f"{t.name!r} is stored in {t.dtype} (keep, offload or recompute it without a codec)"
            )
        r = plan.ranges.get(t.name)
        bn = BnRange(index[r["batchnorm"]], bool(r["relu"]), float(r["sigmas"])) if r else None
        if b in offloaded:
            out[b] = (codec, codec.encoded_nbytes(t.shape, t.dtype, plan.density), False, bn)
            continue
        if codec.sign_only and not program.sign_only(b):
            raise ValueError(
                f"plan {plan.policy!r} binarizes {t.name!r}, but the backward of "
                f"{', '.join(op.name for op in program.backward_readers(b))} needs more than its sign"
            )
        out[b] = (codec, _codecs.stored_nbytes(codec, t.shape, plan.density, t.dtype), codec.sign_only, bn)
    return out


def offload_step(program: Program, b: int, key: Key, nbytes: int, codec_info: Any) -> Offload:
    """The Offload of buffer ``b`` (owner tensor id) under its codec, if any."""
    t = program.tensors[b]
    if codec_info is None:
        return Offload(key, nbytes, nbytes, physical(t.shape))
    codec, transfer_nbytes, _, bn = codec_info
    host = _transfer.host_nbytes(codec, t.shape, t.dtype)
    return Offload(key, host, transfer_nbytes, physical(t.shape), codec, bn, t.dtype)


def prefetch_step(program: Program, b: int, key: Key, nbytes: int, codec_info: Any) -> Prefetch:
    t = program.tensors[b]
    if codec_info is None:
        return Prefetch(key, nbytes, physical(t.shape))
    return Prefetch(key, codec_info[1], physical(t.shape), codec_info[0], t.dtype)


def encode_step(program: Program, b: int, key: Key, enc: Key, codec_info: Any) -> Encode:
    t = program.tensors[b]
    codec, _, _, bn = codec_info
    return Encode(key, enc, codec, physical(t.shape), max(t.nbytes, 1), bn, t.dtype, codec_info[1])


def decode_step(program: Program, b: int, key: Key, enc: Key, codec_info: Any) -> Decode:
    t = program.tensors[b]
    return Decode(key, enc, codec_info[0], physical(t.shape), max(t.nbytes, 1), t.dtype, codec_info[1])


def pinned_bytes(steps: list[Step], alignment: int) -> int:
    """Pinned host bytes the step's offloads need at once, each at the pool's alignment."""
    return sum(_align(st.host_nbytes, alignment) for st in steps if type(st) is Offload)
