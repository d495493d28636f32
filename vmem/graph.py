"""Networks (Sequential, Graph), shape inference, and the Program that policies read.

A :class:`Network` is a DAG of layers with one input and one output. ``net.build(batch)`` infers every
shape and returns a :class:`Program`: the ops in execution order and every tensor with its size,
producer, consumers (reference counts), the memory it shares (in-place layers), and whether backward
needs it. Policies read the Program and nothing else; it holds no data.

In-place rule: a layer declared ``inplace`` (ReLU, Dropout, Flatten) writes its output over its input
when that input is not the network's input, has no other consumer, and its producer's backward does
not read its own output (or the layer only reshapes). Its backward then writes the input gradient over
the output gradient too.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from .errors import CheckpointError, ShapeError
from .nn.base import AuxSpec, Layer, ParamSpec, Shape

__all__ = ["Network", "Sequential", "Graph", "Node", "Program", "TensorInfo", "OpInfo"]

PASSES = ("forward", "backward_data", "backward_filter")


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
    workspace: dict[str, dict[str, int]]  # pass -> algorithm -> bytes

    @property
    def reads_input(self) -> bool:
        return "x" in self.needs

    @property
    def reads_output(self) -> bool:
        return "y" in self.needs or "mask" in self.needs


@dataclass
class Program:
    """Everything a policy needs to know about one training step of a network at a batch size."""

    network: str
    batch: int
    dtype: str
    itemsize: int
    ops: list[OpInfo]
    tensors: list[TensorInfo]
    input: int
    output: int
    num_classes: int

    @property
    def param_bytes(self) -> int:
        """Bytes of trainable parameters (unaligned)."""
        return sum(_nbytes(p.shape, self.itemsize) for op in self.ops for p in op.params.values() if p.trainable)

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
        return [op for op in self.ops if buffer in self.backward_reads(op)]

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
        lines = [f"{self.network}: batch {self.batch}, {len(self.ops)} ops, {self.flops / 1e9:.2f} GFLOP forward, "
                 f"{self.param_bytes / 2**20:.1f} MiB of weights"]
        for op in self.ops:
            out = self.tensors[op.output]
            flag = " (in place)" if op.inplace else ""
            lines.append(f"  {op.index:3d} {op.name:<16} {str(op.out_shape):<22} {out.nbytes / 2**20:9.2f} MiB{flag}")
        return "\n".join(lines)


class Node:
    """A tensor of a network under construction: the network input or the output of a layer."""

    __slots__ = ("graph", "index", "layer", "inputs")

    def __init__(self, graph: "Network", index: int, layer: Layer | None, inputs: tuple["Node", ...]):
        self.graph = graph
        self.index = index
        self.layer = layer
        self.inputs = inputs

    def __repr__(self) -> str:
        return f"Node({self.layer.name if self.layer else 'input'})"


class Network:
    """A DAG of layers with one input and one output; parameters live on the host between runs.

    Subclasses build the DAG: :class:`Sequential` from a list, :class:`Graph` with ``add``.
    """

    def __init__(self, input_shape: Sequence[int] | None = None, name: str | None = None):
        self.name = name or type(self).__name__.lower()
        self.input_shape: tuple[int, ...] | None = tuple(input_shape) if input_shape is not None else None
        self._nodes: list[Node] = [Node(self, 0, None, ())]
        self._output: Node | None = None
        self._names: Counter = Counter()
        self.params: dict[str, np.ndarray] | None = None  # "layer.param" -> host array, after init()
        self._built: dict[tuple, Program] = {}

    # -- construction ------------------------------------------------------------------------------
    @property
    def input(self) -> Node:
        return self._nodes[0]

    def _add(self, layer: Layer, inputs: Sequence[Node], name: str | None) -> Node:
        if not isinstance(layer, Layer):
            raise TypeError(f"{self.name}: expected a vmem.nn layer, got {type(layer).__name__}")
        if layer.name is not None and any(n.layer is layer for n in self._nodes[1:]):
            raise ValueError(f"{self.name}: layer {layer.name!r} is already in the network; make a new one")
        for node in inputs:
            if not isinstance(node, Node) or node.graph is not self:
                raise ValueError(f"{self.name}: inputs of {type(layer).__name__} must be nodes of this network")
        if name is None:
            self._names[layer.kind] += 1
            name = f"{layer.kind}{self._names[layer.kind]}"
            while any(n.layer.name == name for n in self._nodes[1:]):  # type: ignore[union-attr]
                self._names[layer.kind] += 1
                name = f"{layer.kind}{self._names[layer.kind]}"
        elif any(n.layer.name == name for n in self._nodes[1:]):  # type: ignore[union-attr]
            raise ValueError(f"{self.name}: two layers are named {name!r}")
        layer.name = name
        node = Node(self, len(self._nodes), layer, tuple(inputs))
        self._nodes.append(node)
        self._output = node
        self._built.clear()
        return node

    @property
    def layers(self) -> list[Layer]:
        """Layers in execution order."""
        return [n.layer for n in self._nodes[1:]]  # type: ignore[misc]

    def layer(self, name: str) -> Layer:
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(f"{self.name} has no layer named {name!r}")

    # -- shapes ------------------------------------------------------------------------------------
    def build(self, batch: int, input_shape: Sequence[int] | None = None, dtype: str = "float32") -> Program:
        """Infer all shapes for ``batch`` and return the Program (cached per batch, shape and dtype)."""
        if self._output is None:
            raise ShapeError(f"{self.name}: the network has no layers")
        shape = tuple(input_shape) if input_shape is not None else self.input_shape
        if shape is None:
            raise ShapeError(f"{self.name}: no input shape; pass input_shape=(C, H, W) for a network built by hand")
        if not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch={batch!r} must be a positive int")
        key = (batch, shape, dtype)
        if key not in self._built:
            self._built[key] = _build_program(self, batch, shape, dtype)
        return self._built[key]

    def shape_of(self, node: Node, batch: int = 1, input_shape: Sequence[int] | None = None) -> Shape:
        """Logical shape of ``node`` (shape inference up to it; the network need not be complete)."""
        shape = tuple(input_shape) if input_shape is not None else self.input_shape
        if shape is None:
            raise ShapeError(f"{self.name}: no input shape")
        shapes: dict[int, Shape] = {0: (batch,) + tuple(shape)}
        for n in self._nodes[1 : node.index + 1]:
            shapes[n.index] = tuple(n.layer.output_shape([shapes[i.index] for i in n.inputs]))  # type: ignore[union-attr]
        return shapes[node.index]

    def output_shape(self, batch: int = 1, input_shape: Sequence[int] | None = None) -> Shape:
        p = self.build(batch, input_shape)
        return p.tensors[p.output].shape

    def param_specs(self, input_shape: Sequence[int] | None = None) -> dict[str, ParamSpec]:
        """Every parameter and buffer as ``"layer.name" -> ParamSpec`` (physical shapes)."""
        p = self.build(1, input_shape)
        return {f"{op.name}.{k}": s for op in p.ops for k, s in op.params.items()}

    def num_params(self, input_shape: Sequence[int] | None = None) -> int:
        return sum(int(np.prod(s.shape)) for s in self.param_specs(input_shape).values() if s.trainable)

    # -- parameters --------------------------------------------------------------------------------
    def init(self, seed: int = 0, dtype: str = "float32", input_shape: Sequence[int] | None = None) -> "Network":
        """Initialize every parameter from a seeded generator (He for conv, Glorot for linear)."""
        rng = np.random.default_rng(seed)
        params = {}
        for key, spec in self.param_specs(input_shape).items():
            params[key] = _init(rng, spec, dtype)
        self.params = params
        return self

    def state_dict(self) -> dict[str, np.ndarray]:
        if self.params is None:
            raise RuntimeError(f"{self.name}: parameters are not initialized; call init(seed) first")
        return {k: v.copy() for k, v in self.params.items()}

    def load_state_dict(self, state: dict[str, Any], *, source: str = "state") -> None:
        """Replace every parameter; all are checked (names, shapes, dtypes, finiteness) before any changes."""
        specs = self.param_specs()
        missing = sorted(set(specs) - set(state))
        extra = sorted(set(state) - set(specs))
        if missing or extra:
            raise CheckpointError(
                f"{source} does not match network {self.name!r}: "
                + (f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}" if missing else "")
                + ("; " if missing and extra else "")
                + (f"unexpected {extra[:5]}{'...' if len(extra) > 5 else ''}" if extra else "")
            )
        new = {}
        for key, spec in specs.items():
            arr = np.asarray(state[key])
            if tuple(arr.shape) != tuple(spec.shape):
                raise CheckpointError(f"{source}: {key} has shape {tuple(arr.shape)}, the network needs {spec.shape}")
            if arr.dtype.kind != "f":
                raise CheckpointError(f"{source}: {key} has dtype {arr.dtype}, expected floating point")
            new[key] = np.array(arr, dtype=self.params[key].dtype if self.params else arr.dtype)
        self.params = new

    # -- display -----------------------------------------------------------------------------------
    def __repr__(self) -> str:
        body = "\n".join(f"  ({layer.name}) {layer!r}" for layer in self.layers)
        return f"{type(self).__name__}({self.name!r}, input_shape={self.input_shape}\n{body}\n)"


def _init(rng: np.random.Generator, spec: ParamSpec, dtype: str) -> np.ndarray:
    if spec.init == "he":
        arr = rng.standard_normal(spec.shape) * np.sqrt(2.0 / spec.fan_in)
    elif spec.init == "glorot":
        bound = np.sqrt(6.0 / (spec.fan_in + spec.fan_out))
        arr = rng.uniform(-bound, bound, spec.shape)
    elif spec.init == "zeros":
        arr = np.zeros(spec.shape)
    elif spec.init == "ones":
        arr = np.ones(spec.shape)
    else:
        raise ValueError(f"unknown initializer {spec.init!r}")
    return arr.astype(dtype)


class Sequential(Network):
    """A chain of layers: ``vmem.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), ..., input_shape=(3, 32, 32))``."""

    def __init__(self, *layers: Layer, input_shape: Sequence[int] | None = None, name: str | None = None):
        super().__init__(input_shape, name)
        node = self.input
        for layer in layers:
            node = self._add(layer, [node], None)


class Graph(Network):
    """A DAG built step by step, for branches and joins::

        g = vmem.Graph(input_shape=(3, 32, 32))
        a = g.add(nn.Conv2d(3, 16, 3, padding=1), g.input)
        b = g.add(nn.ReLU(), a)
        c = g.add(nn.Add(), b, g.input)   # the last node added is the output unless output() says
    """

    def add(self, layer: Layer, *inputs: Node, name: str | None = None) -> Node:
        if not inputs:
            raise ValueError(f"{self.name}: {type(layer).__name__} needs at least one input node")
        return self._add(layer, inputs, name)

    def output(self, node: Node) -> None:
        if node.graph is not self:
            raise ValueError(f"{self.name}: the output must be a node of this network")
        self._output = node
        self._built.clear()


def _build_program(net: Network, batch: int, input_shape: tuple[int, ...], dtype: str) -> Program:
    itemsize = np.dtype(dtype).itemsize
    assert net._output is not None
    # Only nodes that lead to the output take part; execution order is construction order.
    live = set()
    stack = [net._output]
    while stack:
        node = stack.pop()
        if node.index in live:
            continue
        live.add(node.index)
        stack.extend(node.inputs)
    nodes = [n for n in net._nodes if n.index in live]
    tensor_of: dict[int, int] = {}
    tensors: list[TensorInfo] = []
    ops: list[OpInfo] = []

    in_shape = (batch,) + tuple(input_shape)
    tensors.append(TensorInfo(0, "input", in_shape, _nbytes(in_shape, itemsize), None, buffer=0, needs_grad=False))
    tensor_of[0] = 0
    for node in nodes[1:]:
        layer = node.layer
        assert layer is not None
        inputs = [tensor_of[n.index] for n in node.inputs]
        in_shapes = tuple(tensors[i].shape for i in inputs)
        out_shape = tuple(layer.output_shape(in_shapes))
        index = len(ops)
        tid = len(tensors)
        tensors.append(TensorInfo(tid, layer.name or f"t{tid}", out_shape, _nbytes(out_shape, itemsize), index,
                                  buffer=tid))
        for i in inputs:
            tensors[i].consumers.append(index)
        aux = layer.aux_specs(in_shapes)
        algos = layer.algorithms(in_shapes)
        workspace = {
            p: {a: layer.workspace_bytes(in_shapes, p, a, itemsize) for a in algos.get(p, [None])} for p in PASSES
        }
        ops.append(OpInfo(
            index=index, layer=layer, name=layer.name or f"op{index}", kind=layer.kind, inputs=inputs, output=tid,
            in_shapes=in_shapes, out_shape=out_shape, params=layer.param_specs(in_shapes), aux=aux,
            aux_nbytes={k: _nbytes(a.shape, itemsize if a.dtype == "float" else np.dtype(a.dtype).itemsize)
                        for k, a in aux.items()},
            needs=layer.needs, inplace=False, flops=layer.flops(in_shapes), algorithms=algos, workspace=workspace,
        ))
        tensor_of[node.index] = tid

    output = tensor_of[net._output.index]
    out_shape = tensors[output].shape
    if len(out_shape) != 2:
        raise ShapeError(
            f"{net.name}: the output of layer {tensors[output].name!r} has shape {out_shape}; a classifier "
            "must end in (N, classes) (add Flatten and Linear)"
        )
    # Stash: what backward reads.
    for op in ops:
        if op.reads_input:
            for i in op.inputs:
                tensors[i].stashed = True
        if op.reads_output:
            tensors[op.output].stashed = True
    # In place.
    for op in ops:
        layer = op.layer
        if not layer.inplace:
            continue
        (src,) = op.inputs
        t_in = tensors[src]
        if t_in.producer is None or len(t_in.consumers) != 1:
            continue
        producer = ops[t_in.producer]
        if producer.reads_output and layer.kind != "flatten":
            continue
        if t_in.nbytes != tensors[op.output].nbytes:
            continue
        op.inplace = True
        tensors[op.output].buffer = t_in.buffer
    return Program(network=net.name, batch=batch, dtype=str(np.dtype(dtype)), itemsize=itemsize, ops=ops,
                   tensors=tensors, input=0, output=output, num_classes=out_shape[1])
