"""Typed steps of one training (or inference) step, the buffers they name, and the Schedule that holds them.

The lowering (:mod:`vmem.schedule.lower`) turns a Program and a Plan into a :class:`Schedule`: a list of
steps in host order, with everything the executor needs resolved (algorithms per pass, codecs, ranges,
sync modes, pinned bytes, placements). Four consumers read it: the executor carries it out on a device,
:mod:`~vmem.schedule.replay` runs it through a pool on virtual clocks, its durations come from a cost
model, and :mod:`~vmem.schedule.pack` places its blocks. Each consumer dispatches on the step's type in
one table, checked by :func:`handlers` to cover every kind in :data:`STEPS`: adding a step kind is a new
dataclass here plus one handler per consumer, and a consumer that lacks one fails at import.

Buffers are named by a :class:`Key` (a kind, a tensor or op name, and a part), not by string prefixes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, NamedTuple, Union, get_args

if TYPE_CHECKING:
    from ..codecs import Codec
    from ..graph import Program

__all__ = [
    "Kind",
    "Key",
    "Buffer",
    "BnRange",
    "Alloc",
    "Free",
    "Upload",
    "Forward",
    "Loss",
    "Backward",
    "Accumulate",
    "AccumulateParam",
    "Update",
    "AllReduce",
    "WaitAllReduce",
    "Broadcast",
    "Recompute",
    "Offload",
    "Release",
    "Prefetch",
    "WaitPrefetch",
    "Encode",
    "Decode",
    "CopyOut",
    "Step",
    "STEPS",
    "RELEASES",
    "Schedule",
    "handlers",
]


class Kind(str, Enum):
    """What a buffer holds."""

    VALUE = "fm"  # a feature map (the value of a tensor, shared by in-place layers)
    AUX = "aux"  # saved state a layer makes (argmax map, dropout mask, batch statistics)
    GRAD = "grad"  # the gradient of a tensor (in-place groups share one)
    ACC = "acc"  # a temporary for a second gradient contribution
    GRAD_SLOT = "gslot"  # a gradient slot shared by several gradients (network-wide allocation)
    WORKSPACE = "ws"  # convolution workspace
    ENCODED = "enc"  # the encoding of a feature map kept on the device
    LABELS = "labels"
    PROBS = "probs"
    LOSS = "loss"
    WEIGHT = "w"  # persistent: a parameter (or a non-trainable buffer such as running statistics)
    WEIGHT_GRAD = "g"
    OPT_STATE = "o"


class Key(NamedTuple):
    """A buffer's name: ``Key(Kind.VALUE, "conv1")``, ``Key(Kind.AUX, "maxpool1", "argmax")``."""

    kind: Kind
    name: str = ""
    part: str = ""

    def __str__(self) -> str:
        text = _KEY_TEXT.get(self)
        if text is None:  # made once per key: the executor names a span by its buffer at every step
            if len(_KEY_TEXT) >= 1 << 16:
                _KEY_TEXT.clear()
            text = _KEY_TEXT[self] = ":".join(p for p in (self.kind.value, self.name, self.part) if p)
        return text


_KEY_TEXT: dict[Key, str] = {}


@dataclass(frozen=True, slots=True)
class Buffer:
    """A block the step allocates. ``high``: place it at the high end of free space (long-lived small
    buffers: saved state, labels), away from the large short-lived ones."""

    key: Key
    nbytes: int
    category: str
    high: bool = False


class BnRange(NamedTuple):
    """A fixed-point range from a batch norm's parameters: ``beta +- sigmas * |gamma|`` of op ``op``,
    clamped at 0 when a ReLU follows (see :mod:`vmem.policies.ranges`)."""

    op: int
    relu: bool
    sigmas: float


# -- memory ----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Alloc:
    """Allocate ``buffer`` at its planned ``offset`` (None: the pool's best fit). An encoding whose size
    depends on the data is allocated at its planned size too (see :class:`Encode`)."""

    buffer: Buffer
    offset: int | None = None


@dataclass(frozen=True, slots=True)
class Free:
    key: Key


@dataclass(frozen=True, slots=True)
class Upload:
    """Copy the batch's host data into ``key`` (allocated just before): ``source`` is "labels", "input" (the
    first input) or another input's name (see :meth:`vmem.graph.Program.upload_source`)."""

    key: Key
    source: str


# -- compute ---------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Forward:
    op: int
    algo: str | None = None
    workspace: Key | None = None


@dataclass(frozen=True, slots=True)
class Recompute:
    """Run the forward of ``op`` again during backward, to rebuild a buffer a backward reads (its output is
    allocated just before, its inputs are live). A replay: the layer reuses its saved state (dropout's
    mask) and updates nothing (batch norm's running statistics), so the output is the forward's, bit for bit."""

    op: int
    algo: str | None = None
    workspace: Key | None = None


@dataclass(frozen=True, slots=True)
class Loss:
    """The loss of the logits against the labels; writes the logits' gradient. ``inplace``: the probabilities
    and then the gradient are written over the logits (the layer-wise lowering does so when backward reads
    neither the logits nor anything sharing their buffer), so the loss holds one buffer instead of three."""

    inplace: bool = False


@dataclass(frozen=True, slots=True)
class Backward:
    """The backward of ``op``. ``algos``: (backward-data, backward-filter) for convolutions. ``on_bits``: the
    binarized encoding of the op's output, which its backward (ReLU's) reads instead of the values.
    ``part``: ``"all"``; or, for a convolution whose backward is split (``Plan.split``), ``"filter"`` (the
    weight and bias gradients, from the input and the output's gradient) then ``"data"`` (the input's
    gradient, from the output's gradient and the weights), so that the input can be freed between them."""

    op: int
    algos: tuple[str | None, str | None] | None = None
    workspace: Key | None = None
    on_bits: Key | None = None
    part: str = "all"


@dataclass(frozen=True, slots=True)
class Accumulate:
    """Add the gradient contribution in ``temp`` to the gradient of ``tensor``."""

    tensor: int
    temp: Key


@dataclass(frozen=True, slots=True)
class AccumulateParam:
    """Add a shared parameter's gradient contribution in ``temp`` to its gradient (``param``: "owner.name")."""

    param: str
    temp: Key
    nbytes: int


@dataclass(frozen=True, slots=True)
class Update:
    """The optimizer's update of the trainable parameters ``params`` (``"layer.param"`` names), every one when
    None. A step may update its parameters in several buckets, each an Update after their gradients are
    final; the first decides for all whether the loss and every gradient are finite: a step that is not
    updates no bucket."""

    params: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class AllReduce:
    """Start summing the gradients of ``params`` (bucket ``bucket``) over the ranks of a data-parallel run, on
    the communication stream, once the compute stream has written them (then each is divided by the number
    of ranks: the mean over the whole batch). Inserted by :func:`vmem.schedule.collectives.with_allreduce`."""

    bucket: int
    params: tuple[str, ...]
    nbytes: int


@dataclass(frozen=True, slots=True)
class Broadcast:
    """After the updates, each rank sends the weights it updated to the others (optimizer state sharded
    over the ranks, ZeRO's stage 1): ``params`` is (parameter, the rank that owns its optimizer state), in
    the order every rank sends and receives them; ``nbytes`` their weights' bytes. Runs on the
    communication stream; the step ends when it has."""

    params: tuple[tuple[str, int], ...]
    nbytes: int


@dataclass(frozen=True, slots=True)
class WaitAllReduce:
    """The compute stream waits for bucket ``bucket``'s :class:`AllReduce` (before the updates)."""

    bucket: int


# -- offload and encodings ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Offload:
    """Start copying ``key`` to pinned host memory on the memory stream (through ``codec`` if set: only the
    encoded bytes cross), once the compute stream has written it for the last time; the buffer stays
    on the device, read-only, until its :class:`Release`. ``shape``: its stored (physical) shape."""

    key: Key
    host_nbytes: int  # pinned bytes it needs (the codec's worst case)
    transfer_nbytes: int  # bytes expected on the bus (the codec's size at the plan's density)
    shape: tuple[int, ...]
    codec: "Codec | None" = None
    range: BnRange | None = None
    dtype: str = "float32"  # what the buffer stores (a codec reads it in this dtype)


@dataclass(frozen=True, slots=True)
class Release:
    """Release an offloaded buffer after its last forward reader: the compute stream first waits for its
    copy (``sync="layer"``, vDNN's), or the block is freed on the memory stream, reusable once the copy's
    event has completed (``"event"``)."""

    key: Key
    sync: str


@dataclass(frozen=True, slots=True)
class Prefetch:
    """Copy an offloaded buffer back (decoding on the way) into ``key``, allocated just before."""

    key: Key
    transfer_nbytes: int
    shape: tuple[int, ...]
    codec: "Codec | None" = None
    dtype: str = "float32"


@dataclass(frozen=True, slots=True)
class WaitPrefetch:
    """The compute stream waits for ``key``'s prefetch (before the first backward that reads it)."""

    key: Key


@dataclass(frozen=True, slots=True)
class Encode:
    """Encode ``key`` into ``enc`` on the compute stream (after its last forward use). ``enc``'s block is
    sized at the plan's density where the encoding's size depends on the data; an encoding that comes out
    larger is not stored there: the value's bytes are kept in host memory until its Decode (spilled)."""

    key: Key
    enc: Key
    codec: "Codec"
    shape: tuple[int, ...]
    nbytes: int  # the value buffer's bytes (for cost models)
    range: BnRange | None = None
    dtype: str = "float32"
    enc_nbytes: int = 0  # the encoding's bytes (for cost models: the kernel reads one and writes the other)


@dataclass(frozen=True, slots=True)
class Decode:
    """Decode ``enc`` back into ``key`` (allocated just before) before its first backward reader."""

    key: Key
    enc: Key
    codec: "Codec"
    shape: tuple[int, ...]
    nbytes: int
    dtype: str = "float32"
    enc_nbytes: int = 0


@dataclass(frozen=True, slots=True)
class CopyOut:
    """Copy the network's output to the host (inference: the logits)."""

    key: Key
    tensor: int


Step = Union[
    Alloc,
    Free,
    Upload,
    Forward,
    Recompute,
    Loss,
    Backward,
    Accumulate,
    AccumulateParam,
    Update,
    AllReduce,
    WaitAllReduce,
    Broadcast,
    Offload,
    Release,
    Prefetch,
    WaitPrefetch,
    Encode,
    Decode,
    CopyOut,
]
#: Every step kind (the members of :data:`Step`, listed once there): a consumer's handler table must cover all
#: of them.
STEPS: tuple[type, ...] = get_args(Step)
#: Steps that release a buffer (its block is free after them).
RELEASES: tuple[type, ...] = (Free, Release)


def handlers(table: dict[type, Any], consumer: str) -> dict[type, Any]:
    """Check that ``table`` has an entry for every step kind (None: nothing to do) and return it."""
    missing = [t.__name__ for t in STEPS if t not in table]
    extra = [t.__name__ for t in table if t not in STEPS]
    if missing or extra:
        raise TypeError(
            f"{consumer}: step handlers do not match the step kinds "
            f"(missing {missing or 'none'}, unknown {extra or 'none'})"
        )
    return table


@dataclass
class Schedule:
    """One step of a Program under a Plan, resolved: the executor reads this and the device, nothing else.

    ``value``/``grad``: tensor id -> the buffer holding its value / gradient; ``aux``: (op, name) -> buffer;
    ``acc``: (op, input position) -> the temporary its backward writes that input's gradient into;
    ``pinned_bytes``: pinned host memory the step's offloads need, at ``alignment``."""

    program: "Program"
    persistent: list[Buffer]  # allocated once, before the first step (weights, their gradients, optimizer state)
    steps: list[Step]
    value: dict[int, Key]
    grad: dict[int, Key] = field(default_factory=dict)
    aux: dict[tuple[int, str], Key] = field(default_factory=dict)
    acc: dict[tuple[int, int], Key] = field(default_factory=dict)
    #: op -> parameter -> the temporary its backward writes that gradient into (a shared parameter's later uses)
    param_acc: dict[int, dict[str, Key]] = field(default_factory=dict)
    needs_grad: list[bool] = field(default_factory=list)
    alignment: int = 256
    pinned_bytes: int = 0
    training: bool = True
    #: the most pool bytes in use at once (the persistent buffers included), known once the blocks are
    #: placed (:func:`vmem.schedule.pack.place`): a device with less cannot run the step, however packed
    live_bytes: int | None = None
    #: where the blocks were placed for an arena of a given size (:func:`vmem.schedule.pack.place`), the
    #: sizes ``[lo, hi)`` for which the same placement would be made (None: placed as tightly as it can)
    placed_for: tuple[int, float] | None = None
    #: the arena's top under that placement (the persistent buffers included): at any capacity holding it,
    #: every block takes its planned place, and the replay is the same
    placed_top: int | None = None
    #: the ranks of a data-parallel run whose gradients its AllReduce steps sum (1: one process)
    world: int = 1
    #: with the optimizer's state sharded over the ranks: the rank whose share this schedule holds
    shard_rank: int | None = None

    @property
    def fused_relu(self) -> dict[int, int]:
        """conv op -> the ReLU whose forward it runs in its own last pass (bias and ReLU in one kernel on a
        GPU): :meth:`~vmem.graph.program.Program.conv_relus`. The ReLU's own Forward and Recompute steps then
        do nothing."""
        return self.program.conv_relus()

    @property
    def fused_pool_relu(self) -> dict[int, int]:
        """max-pool op -> the ReLU whose backward it runs in its own (one kernel on a GPU), for each pool whose
        only input is an in-place ReLU's output, read by nothing else: the ReLU's input gradient is its output
        gradient's buffer, which the pool writes, so ``dx * (relu output > 0)`` there is what the ReLU's
        backward would write. Only where the ReLU's output stays on the device through the backward (no
        offload, encoding or recomputation of its buffer, no binarized backward), so that the pool's backward
        reads it where the ReLU's would. The ReLU's own Backward step then does nothing."""
        ops, tensors = self.program.ops, self.program.tensors
        moved = {
            st.key for st in self.steps if isinstance(st, (Offload, Release, Prefetch, WaitPrefetch, Encode, Decode))
        }
        rebuilt = {tensors[ops[st.op].output].buffer for st in self.steps if type(st) is Recompute}
        plain = {st.op for st in self.steps if type(st) is Backward and st.on_bits is None and st.part == "all"}
        order = [st.op for st in self.steps if type(st) is Backward]
        fused = {}
        for pool in ops:
            if pool.kind != "maxpool" or pool.staged or len(pool.inputs) != 1 or pool.index not in plain:
                continue
            t = tensors[pool.inputs[0]]
            relu = ops[t.producer] if t.producer is not None else None
            if relu is None or relu.kind != "relu" or not relu.inplace or relu.staged or relu.index not in plain:
                continue
            if list(t.consumers) != [pool.index] or not self.needs_grad[relu.inputs[0]]:
                continue
            if self.value.get(t.id) in moved or t.buffer in rebuilt:
                continue
            if order.index(pool.index) > order.index(relu.index):
                continue
            fused[pool.index] = relu.index
        return fused

    @property
    def offloaded_bytes(self) -> int:
        """Bytes the step's offloads are expected to move to the host."""
        return sum(st.transfer_nbytes for st in self.steps if type(st) is Offload)

    @property
    def copies(self) -> int:
        """The host-device copies the step makes: its offloads and prefetches."""
        return sum(1 for st in self.steps if type(st) in (Offload, Prefetch))
