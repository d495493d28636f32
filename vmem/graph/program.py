"""The Program: one training step of a network at a batch size, as policies see it. Plain data.

``build_program`` infers every shape and returns the ops in execution order and every tensor with its size,
producer, consumers (reference counts), the memory it shares (in-place layers), and whether backward
needs it. Its convolutions offer the default catalog's algorithms (the host's, which :mod:`vmem.device`
registers with :func:`set_default_catalog` when it is imported: the program itself knows no device);
another device's ``catalog(program)`` replaces them with its own.

In-place rule: a layer declared ``inplace`` (ReLU, Dropout, Flatten) writes its output over its input
when that input is not the network's input, has no other consumer, and its producer's backward does
not read its own output (or the layer only reshapes). Its backward then writes the input gradient over
the output gradient too.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ..errors import ShapeError
from ..precision import PRECISIONS, activations_dtype, dtype as _dtype
from ..nn.base import PASSES, AuxSpec, Layer, ParamSpec, Shape
from .ties import apply_ties

if TYPE_CHECKING:
    from .network import Network

__all__ = ["Program", "TensorInfo", "OpInfo", "Precision", "build_program", "set_default_catalog", "PASSES"]


def _nbytes(shape: Shape, itemsize: int) -> int:
    return int(np.prod(shape, dtype=np.int64)) * itemsize


@dataclass
class TensorInfo:
    """A tensor of one training step. ``shape`` is logical (NCHW); ``buffer`` is the id of the tensor
    whose memory it occupies (its own id unless an in-place layer wrote it over its input)."""

    id: int
    name: str
    shape: Shape
    nbytes: int
    producer: int | None  # op index; None for the network input
    consumers: list[int] = field(default_factory=list)
    buffer: int = -1
    stashed: bool = False  # read by some backward
    needs_grad: bool = True  # its gradient is computed
    dtype: str = "float32"  # what it is stored in (its gradient too); ``nbytes`` counts in it


@dataclass
class OpInfo:
    """One layer application in execution order."""

    index: int
    layer: Layer
    name: str
    kind: str
    inputs: list[int]
    output: int
    in_shapes: tuple[Shape, ...]
    out_shape: Shape
    params: dict[str, ParamSpec]
    aux: dict[str, AuxSpec]
    aux_nbytes: dict[str, int]
    needs: frozenset[str]
    inplace: bool
    flops: int
    algorithms: dict[str, list[str]]
    workspace: dict[str, dict[str | None, int]]  # pass -> algorithm (None: an op with no choice) -> bytes
    shares: str | None = None  # the op whose parameters this one uses (a layer applied at several places)
    #: parameters of its own that are another op's (``Network.tie``): name -> ``"owner.param"``
    ties: dict[str, str] = field(default_factory=dict)
    in_dtypes: tuple[str, ...] = ()  # what its inputs are stored in
    out_dtype: str = "float32"  # what its output is stored in
    #: what the device computes it in where that differs from what it reads (float32 over fp16 storage on
    #: the CPU device, set by its catalog); None: its first input's dtype
    compute: str | None = None

    @property
    def dtype(self) -> np.dtype:
        """What it computes on: ``compute`` if the device's catalog set it, else its first input's dtype
        (every op has an input)."""
        return _dtype(self.compute or self.in_dtypes[0])

    @property
    def staged(self) -> bool:
        """Whether the device computes it in another dtype than some of its tensors are stored in (each is
        cast into a staging copy in the op's workspace, each output rounded once back)."""
        return self.compute is not None and any(d != self.compute for d in (*self.in_dtypes, self.out_dtype))

    @property
    def itemsize(self) -> int:
        """Bytes per value of the data it computes on."""
        return self.dtype.itemsize

    @property
    def param_owner(self) -> str:
        """The op name the parameters are stored under (``"owner.weight"``)."""
        return self.shares or self.name

    def param_key(self, key: str) -> str:
        """Where its parameter ``key`` is stored: ``"owner.key"``, or the parameter it is tied to."""
        return self.ties.get(key) or f"{self.param_owner}.{key}"

    @property
    def reads_input(self) -> bool:
        return "x" in self.needs

    @property
    def reads_output(self) -> bool:
        return "y" in self.needs or "mask" in self.needs


@dataclass(frozen=True)
class Precision:
    """What one training step stores in what (NumPy dtype names): ``activations`` (feature maps and their
    gradients, unless a layer stores its output otherwise: ``TensorInfo.dtype``), ``parameters`` (the
    weights the layers read), ``gradients`` (the weights' gradients), ``master`` (the weights the optimizer
    updates) and ``optimizer_state``."""

    activations: str
    parameters: str
    gradients: str
    master: str
    optimizer_state: str

    def itemsize(self, role: str) -> int:
        """Bytes per value of ``role`` (``"parameters"``, ``"gradients"``, ...)."""
        return _dtype(getattr(self, role)).itemsize

    @classmethod
    def uniform(cls, dtype: str) -> "Precision":
        """Everything in ``dtype``."""
        name = str(np.dtype(dtype))
        return cls(name, name, name, name, name)

    @classmethod
    def of(cls, precision: str, dtype: str = "float32") -> "Precision":
        """A training precision (:data:`vmem.precision.PRECISIONS`): feature maps in its dtype, the rest
        (weights, their gradients, master weights, optimizer state) in the network's ``dtype``."""
        low = activations_dtype(precision)
        rest = str(np.dtype(dtype))
        return cls(low if precision != "fp32" else rest, rest, rest, rest, rest)

    @property
    def name(self) -> str:
        """The precision's name (``"fp32"``, ``"fp16"``, ``"bf16"``; the network's dtype where everything is
        stored in it), or ``"mixed"`` for another record."""
        if self == Precision.uniform(self.master):
            return "fp32" if self.master == "float32" else self.master
        for name, low in PRECISIONS.items():
            if name != "fp32" and self == dataclasses.replace(Precision.uniform(self.master), activations=low):
                return name
        return "mixed"


@dataclass
class Program:
    """Everything a policy needs to know about one training step of a network at a batch size."""

    network: str
    batch: int
    dtype: str  # what the network was built in: the default of every role in ``precision``
    ops: list[OpInfo]
    tensors: list[TensorInfo]
    input: int
    output: int
    num_classes: int
    precision: Precision = field(default_factory=lambda: Precision.uniform("float32"))
    #: every input's tensor, ``input`` first (a network of several inputs: token ids and a mask)
    inputs: tuple[int, ...] = ()

    @property
    def input_tensors(self) -> tuple[int, ...]:
        """The inputs' tensors, ``input`` first."""
        return self.inputs or (self.input,)

    def upload_source(self, tensor: int) -> str:
        """What an input's Upload step names the batch array it copies: ``"input"`` for the first input,
        its tensor's name for the others."""
        return "input" if tensor == self.input else self.tensors[tensor].name

    @property
    def param_bytes(self) -> int:
        """Bytes of trainable parameters (unaligned)."""
        return sum(
            _nbytes(s.shape, self.precision.itemsize("parameters")) for _, _, s in self.owned_params() if s.trainable
        )

    def owned_params(self) -> list[tuple["OpInfo", str, ParamSpec]]:
        """Every parameter once: (owner op, name, spec); ops that share another's parameters are skipped, and
        parameters tied to another op's (``Network.tie``)."""
        return [
            (op, k, spec) for op in self.ops if op.shares is None for k, spec in op.params.items() if k not in op.ties
        ]

    @property
    def loss_dtype(self) -> str:
        """What the loss and its probabilities are computed in: the master weights' dtype (float32 under
        mixed precision, whose logits are stored in half precision)."""
        return self.precision.master

    @property
    def label_shape(self) -> Shape:
        """Shape of the step's labels: one per sample, or one per token of a sequence output."""
        return tuple(self.tensors[self.output].shape[:-1])

    @property
    def flops(self) -> int:
        """Forward FLOPs of the step (backward is about twice that)."""
        return sum(op.flops for op in self.ops)

    def buffers(self) -> list[TensorInfo]:
        """Tensors that own their memory (one per distinct feature-map buffer)."""
        return [t for t in self.tensors if t.buffer == t.id]

    def stashed_buffers(self) -> set[int]:
        """Buffers (owner tensor ids) that some backward reads, through any tensor sharing them."""
        return {t.buffer for t in self.tensors if t.stashed}

    def backward_reads(self, op: OpInfo) -> list[int]:
        """Buffers the backward of ``op`` reads (its inputs if it needs them, its output if it needs that)."""
        reads = [self.tensors[i].buffer for i in op.inputs] if op.reads_input else []
        if op.reads_output:
            reads.append(self.tensors[op.output].buffer)
        return list(dict.fromkeys(reads))

    def backward_readers(self, buffer: int) -> list[OpInfo]:
        """Ops whose backward reads ``buffer`` (an owner tensor id)."""
        return list(self._backward_readers.get(buffer, ()))

    @functools.cached_property
    def _backward_readers(self) -> dict[int, list[OpInfo]]:
        """Per buffer, the ops whose backward reads it (made once: a Program's ops do not change after it
        is built; a changed Program is a new one, ``dataclasses.replace``)."""
        out: dict[int, list[OpInfo]] = {}
        for op in self.ops:
            for b in self.backward_reads(op):
                out.setdefault(b, []).append(op)
        return out

    def derived(self, key: Any, make: Any) -> Any:
        """``make()``, computed once per Program and kept with it under ``key``: for what the layers above
        derive from a Program alone (a Program does not change after it is built; a changed Program is a
        new one). The value is shared by every caller: copy it before changing it."""
        memo = self.__dict__.setdefault("_derived", {})
        if key not in memo:
            memo[key] = make()
        return memo[key]

    @functools.cached_property
    def buffer_writers(self) -> dict[int, tuple[int, ...]]:
        """Per buffer: the indices of the ops that write it, in order (its producer, then in-place layers)."""
        out: dict[int, list[int]] = {}
        for op in self.ops:
            out.setdefault(self.tensors[op.output].buffer, []).append(op.index)
        return {b: tuple(ops) for b, ops in out.items()}

    def conv_relus(self) -> dict[int, int]:
        """conv op -> the ReLU written in place over its output, neither staged: the ReLU is the output's only
        reader and overwrites it, so a device may run it in the convolution's own last pass (vmem's bias+ReLU
        kernel, or cuDNN's fused conv+bias+ReLU graph) and what any later step reads is the same."""
        return self.derived("conv_relus", self._conv_relus)

    def _conv_relus(self) -> dict[int, int]:
        ops, fused = self.ops, {}
        for op in ops:
            if op.kind != "relu" or not op.inplace or op.staged:
                continue
            producer = self.tensors[op.inputs[0]].producer
            if producer is not None and ops[producer].kind == "conv" and not ops[producer].staged:
                fused[producer] = op.index
        return fused

    def sign_only(self, buffer: int) -> bool:
        """Whether every backward that reads ``buffer`` needs only the sign of its own output (ReLU's)."""
        return all(not op.reads_input and op.layer.needs == frozenset({"mask"}) for op in self.backward_readers(buffer))

    def tensor(self, name_or_id: str | int) -> TensorInfo:
        if isinstance(name_or_id, int):
            return self.tensors[name_or_id]
        for t in self.tensors:
            if t.name == name_or_id:
                return t
        raise KeyError(f"no tensor named {name_or_id!r}")

    def summary(self) -> str:
        lines = [
            f"{self.network}: batch {self.batch}, {len(self.ops)} ops, {self.flops / 1e9:.2f} GFLOP forward, "
            f"{self.param_bytes / 2**20:.1f} MiB of weights"
        ]
        for op in self.ops:
            out = self.tensors[op.output]
            flag = " (in place)" if op.inplace else ""
            lines.append(f"  {op.index:3d} {op.name:<16} {str(op.out_shape):<22} {out.nbytes / 2**20:9.2f} MiB{flag}")
        return "\n".join(lines)


def _live_nodes(net: "Network") -> list[Any]:
    """The nodes that lead to the output, in construction order (which is execution order)."""
    live: set[int] = set()
    stack = [net._output] if net._output is not None else []
    while stack:
        node = stack.pop()
        if node.index in live:
            continue
        live.add(node.index)
        stack.extend(node.inputs)
    return [n for n in net._nodes if n.index in live]


def _op(
    layer: Layer,
    index: int,
    inputs: list[int],
    output: int,
    in_shapes: tuple[Shape, ...],
    out_shape: Shape,
    in_dtypes: tuple[str, ...],
    out_dtype: str,
    float_itemsize: int,
    name: str | None = None,
    shares: str | None = None,
) -> OpInfo:
    aux = layer.aux_specs(in_shapes)
    return OpInfo(
        index=index,
        layer=layer,
        name=name or layer.name or f"op{index}",
        kind=layer.kind,
        shares=shares,
        inputs=inputs,
        output=output,
        in_shapes=in_shapes,
        out_shape=out_shape,
        params=layer.param_specs(in_shapes),
        aux=aux,
        aux_nbytes={
            k: _nbytes(a.shape, float_itemsize if a.dtype == "float" else np.dtype(a.dtype).itemsize)
            for k, a in aux.items()
        },
        needs=layer.needs,
        inplace=False,
        flops=layer.flops(in_shapes),
        algorithms={},  # no choice until a catalog offers some (build_program: the host's)
        workspace={p: {None: 0} for p in PASSES},
        in_dtypes=in_dtypes,
        out_dtype=out_dtype,
    )


def _mark_stash_and_inplace(ops: list[OpInfo], tensors: list[TensorInfo]) -> None:
    """Stash what backward reads; let in-place layers write over their input where the rule allows."""
    for op in ops:
        if op.reads_input:
            for i in op.inputs:
                tensors[i].stashed = True
        if op.reads_output:
            tensors[op.output].stashed = True
    for op in ops:
        layer = op.layer
        if not layer.aliases(op.in_shapes):
            continue
        (src,) = op.inputs
        t_in = tensors[src]
        if t_in.producer is None or len(t_in.consumers) != 1:
            continue
        if ops[t_in.producer].reads_output and layer.kind not in ("flatten", "reshape"):
            continue
        if t_in.nbytes != tensors[op.output].nbytes or t_in.dtype != tensors[op.output].dtype:
            continue
        op.inplace = True
        tensors[op.output].buffer = t_in.buffer


def build_program(
    net: "Network", batch: int, input_shape: tuple[int, ...], dtype: str, precision: str = "fp32"
) -> Program:
    """Shape inference over ``net`` for ``batch`` (see the module docstring for the in-place rule).

    ``precision`` (:mod:`vmem.precision`) is what feature maps are stored in, the input batch and the
    logits included (the input is rounded into it as it is staged, unless a layer reads it as integer ids;
    the loss reads the logits into ``dtype``); saved state marked ``"float"`` (batch norm's statistics)
    and the weights stay in ``dtype``."""
    itemsize = np.dtype(dtype).itemsize
    assert net._output is not None
    in_shape = (batch,) + tuple(input_shape)
    record = Precision.of(precision, dtype)
    stored_as = record.activations
    network_dtype = str(np.dtype(dtype))
    live = _live_nodes(net)
    ids: set[int] = set()  # nodes whose values are integer ids (what an Embedding reads, and what they are cut from)
    for node in reversed(live[1:]):
        if node.layer is not None and (node.layer.reads_ids or node.index in ids):
            ids.update(i.index for i in node.inputs)
        elif node.layer is not None and node.layer.id_inputs:
            ids.update(node.inputs[k].index for k in node.layer.id_inputs)
    # every input, the first first (tensor 0), each with the shape the network gives it; unused ones too
    shapes = [in_shape] + [(batch,) + tuple(shape) for shape in net.input_shapes(input_shape)[1:]]
    tensors: list[TensorInfo] = []
    tensor_of: dict[int, int] = {}
    for node, shape in zip(net.inputs, shapes):
        in_dtype = network_dtype if node.index in ids else stored_as
        tid = len(tensors)
        tensors.append(
            TensorInfo(
                tid,
                node.name if tid else "input",
                shape,
                _nbytes(shape, _dtype(in_dtype).itemsize),
                None,
                buffer=tid,
                needs_grad=False,
                dtype=in_dtype,
            )
        )
        tensor_of[node.index] = tid
    ops: list[OpInfo] = []
    owner_specs: dict[str, Any] = {}
    for node in live[1:]:
        layer = node.layer
        if layer is None:  # an input: made above
            continue
        inputs = [tensor_of[n.index] for n in node.inputs]
        in_shapes = tuple(tensors[i].shape for i in inputs)
        out_shape = tuple(layer.output_shape(in_shapes))
        tid = len(tensors)
        stored = str(_dtype(layer.output_dtype([tensors[i].dtype for i in inputs], stored_as)))
        if node.index in ids:
            stored = network_dtype  # ids stay exact
        tname = node.alias or layer.name or f"t{tid}"
        tensors.append(
            TensorInfo(
                tid, tname, out_shape, _nbytes(out_shape, _dtype(stored).itemsize), len(ops), buffer=tid, dtype=stored
            )
        )
        for i in inputs:
            tensors[i].consumers.append(len(ops))
        shares = layer.name if node.alias else None
        if shares is not None and layer.param_specs(in_shapes) != owner_specs.get(shares):
            raise ShapeError(
                f"{net.name}: {node.alias!r} reuses layer {layer.name!r} on inputs {in_shapes} that "
                f"need other parameters than its first use"
            )
        in_dtypes = tuple(tensors[i].dtype for i in inputs)
        ops.append(_op(layer, len(ops), inputs, tid, in_shapes, out_shape, in_dtypes, stored, itemsize, tname, shares))
        if shares is None:
            owner_specs[tname] = ops[-1].params
        tensor_of[node.index] = tid
    output = tensor_of[net._output.index]  # of any shape: what a loss takes is the loss's to check
    apply_ties(net.name, ops, net.ties)
    _mark_stash_and_inplace(ops, tensors)
    program = Program(
        network=net.name,
        batch=batch,
        dtype=str(np.dtype(dtype)),
        ops=ops,
        tensors=tensors,
        input=0,
        output=output,
        inputs=tuple(range(len(net.inputs))),
        num_classes=out_shape[-1],
        precision=record,
    )
    return _default_catalog(program) if _default_catalog is not None else program


#: What a program as built offers its convolutions (set by vmem.device: the host's catalog)
_default_catalog: Callable[[Program], Program] | None = None


def set_default_catalog(catalog: Callable[[Program], Program] | None) -> None:
    """Make ``catalog`` (a device's ``catalog``: a program with its convolutions' algorithms and their
    workspace) what every program is built with; None: programs offer no algorithms until a device's
    catalog is applied."""
    global _default_catalog
    _default_catalog = catalog
