"""Networks: Sequential and Graph builders over a DAG of layers; parameters live on the host.

A :class:`Network` is a DAG of layers with an input (a :class:`Graph` may add more: token ids and a mask)
and one output. ``net.build(batch)`` infers every shape and returns a
:class:`~vmem.graph.program.Program`: what policies read. It holds no data.
"""

from __future__ import annotations

from collections import Counter
from types import MappingProxyType
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import CheckpointError, ShapeError
from ..nn.base import Layer, ParamSpec, Shape
from .program import Program, build_program

__all__ = ["Network", "Sequential", "Graph", "Node"]


class Node:
    """A tensor of a network under construction: the network input or the output of a layer."""

    __slots__ = ("graph", "index", "layer", "inputs", "alias")

    def __init__(
        self, graph: "Network", index: int, layer: Layer | None, inputs: tuple["Node", ...], alias: str | None = None
    ):
        self.graph = graph
        self.index = index
        self.layer = layer
        self.inputs = inputs
        self.alias = alias  # the op's name where a layer is applied again (its parameters are shared)

    @property
    def name(self) -> str:
        return self.alias or (self.layer.name if self.layer else "input") or ""

    def __repr__(self) -> str:
        return f"Node({self.name})"


class Network:
    """A DAG of layers with one input and one output; parameters live on the host between runs.

    Subclasses build the DAG: :class:`Sequential` from a list, :class:`Graph` with ``add``.
    """

    #: the loss the network trains with unless a Trainer is given one (None: softmax cross-entropy)
    loss: Any = None
    #: ``vmem train``'s defaults for this network where they differ from the generic ones (batch, epochs,
    #: optimizer, lr); a model that has its own sets them on its instance
    train_defaults: Mapping[str, Any] = MappingProxyType({})

    def __init__(self, input_shape: Sequence[int] | None = None, name: str | None = None):
        self.name = name or type(self).__name__.lower()
        self.input_shape: tuple[int, ...] | None = tuple(input_shape) if input_shape is not None else None
        self._nodes: list[Node] = [Node(self, 0, None, ())]
        #: the shapes (without the batch axis) of the inputs added after the first (Graph.add_input)
        self._input_shapes: dict[int, tuple[int, ...]] = {}
        self._output: Node | None = None
        self._names: Counter = Counter()
        #: the names of the nodes after the first input, and how many nodes apply each layer (by id): kept as
        #: nodes are added, so that adding one looks nothing up in the others (an unrolled LSTM has thousands)
        self._taken: set[str] = set()
        self._uses: Counter = Counter()
        self.params: dict[str, np.ndarray] | None = None  # "layer.param" -> host array, after init()
        #: where an imported network's parameters came from: "layer.param" -> the initializer's name in the
        #: model (vmem.onnx.load; PyTorch's exports keep the module's names, e.g. "layer1.0.conv1.weight")
        self.sources: dict[str, str] = {}
        self._ties: dict[str, str] = {}
        self._built: dict[tuple, Program] = {}

    # -- construction ------------------------------------------------------------------------------
    @property
    def input(self) -> Node:
        return self._nodes[0]

    @property
    def inputs(self) -> list[Node]:
        """Every input, the first (``input``) first, then those ``Graph.add_input`` added, in order."""
        return [self._nodes[0]] + [n for n in self._nodes[1:] if n.layer is None]

    def input_shapes(self, input_shape: Sequence[int] | None = None) -> list[tuple[int, ...]]:
        """Each input's shape without the batch axis (the first's ``input_shape`` where given)."""
        first = tuple(input_shape) if input_shape is not None else self.input_shape
        if first is None:
            raise ShapeError(f"{self.name}: no input shape; pass input_shape=(C, H, W) for a network built by hand")
        return [first] + [self._input_shapes[n.index] for n in self.inputs[1:]]

    def _add(self, layer: Layer, inputs: Sequence[Node], name: str | None) -> Node:
        if not isinstance(layer, Layer):
            raise TypeError(f"{self.name}: expected a vmem.nn layer, got {type(layer).__name__}")
        if layer.name is not None and self._uses[id(layer)]:
            raise ValueError(
                f"{self.name}: layer {layer.name!r} is already in the network; make a new one, or "
                "share its parameters with Graph.reuse()"
            )
        for node in inputs:
            if not isinstance(node, Node) or node.graph is not self:
                raise ValueError(f"{self.name}: inputs of {type(layer).__name__} must be nodes of this network")
        if name is None:
            self._names[layer.kind] += 1
            name = f"{layer.kind}{self._names[layer.kind]}"
            while name in self._taken:
                self._names[layer.kind] += 1
                name = f"{layer.kind}{self._names[layer.kind]}"
        elif name in self._taken:
            raise ValueError(f"{self.name}: two layers are named {name!r}")
        layer.name = name
        node = self._append(Node(self, len(self._nodes), layer, tuple(inputs)))
        self._output = node
        self._built.clear()
        return node

    def _append(self, node: Node) -> Node:
        self._nodes.append(node)
        self._taken.add(node.name)
        if node.layer is not None:
            self._uses[id(node.layer)] += 1
        return node

    def tie(self, param: str, to: str) -> None:
        """Make parameter ``param`` (``"head.weight"``) parameter ``to`` (``"embed.weight"``) of another layer:
        one array that both layers read, trained with the sum of their gradients (a language model's head
        tied to its embedding). Both must have one shape (checked when the network is built); ``param``
        leaves ``params`` and ``param_specs``, and its value, if set, gives way to ``to``'s."""
        if param == to:
            raise ValueError(f"{self.name}: tie({param!r}, {to!r}) ties a parameter to itself")
        self._ties[param] = to
        if self.params is not None:
            self.params.pop(param, None)
        self._built.clear()

    @property
    def ties(self) -> Mapping[str, str]:
        """The tied parameters (:meth:`tie`): ``"layer.param"`` -> the ``"owner.param"`` it is."""
        return MappingProxyType(self._ties)

    @property
    def layers(self) -> list[Layer]:
        """Layers in execution order."""
        return [n.layer for n in self._nodes[1:] if n.layer is not None]

    def layer(self, name: str) -> Layer:
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(f"{self.name} has no layer named {name!r}")

    # -- shapes ------------------------------------------------------------------------------------
    def build(
        self, batch: int, input_shape: Sequence[int] | None = None, dtype: str = "float32", precision: str = "fp32"
    ) -> Program:
        """Infer all shapes for ``batch`` and return the Program (cached per batch, shape, dtype and precision:
        ``"fp16"`` or ``"bf16"`` store feature maps in half precision, see :mod:`vmem.precision`)."""
        if self._output is None:
            raise ShapeError(f"{self.name}: the network has no layers")
        shape = tuple(input_shape) if input_shape is not None else self.input_shape
        if shape is None:
            raise ShapeError(f"{self.name}: no input shape; pass input_shape=(C, H, W) for a network built by hand")
        if not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch={batch!r} must be a positive int")
        key = (batch, shape, dtype, precision)
        if key not in self._built:
            self._built[key] = build_program(self, batch, shape, dtype, precision)
        return self._built[key]

    def shape_of(self, node: Node, batch: int = 1, input_shape: Sequence[int] | None = None) -> Shape:
        """Logical shape of ``node`` (shape inference up to it; the network need not be complete)."""
        shape = tuple(input_shape) if input_shape is not None else self.input_shape
        if shape is None:
            raise ShapeError(f"{self.name}: no input shape")
        shapes: dict[int, Shape] = {0: (batch,) + tuple(shape)}
        for n in self._nodes[1 : node.index + 1]:
            if n.layer is None:  # another input
                shapes[n.index] = (batch,) + self._input_shapes[n.index]
                continue
            shapes[n.index] = tuple(n.layer.output_shape([shapes[i.index] for i in n.inputs]))
        return shapes[node.index]

    def output_shape(self, batch: int = 1, input_shape: Sequence[int] | None = None) -> Shape:
        p = self.build(batch, input_shape)
        return p.tensors[p.output].shape

    def param_specs(self, input_shape: Sequence[int] | None = None) -> dict[str, ParamSpec]:
        """Every parameter and buffer as ``"layer.name" -> ParamSpec`` (physical shapes)."""
        p = self.build(1, input_shape)
        return {f"{op.name}.{k}": s for op, k, s in p.owned_params()}

    def num_params(self, input_shape: Sequence[int] | None = None) -> int:
        """How many trainable values the network has (its state buffers, such as batch norm's running
        statistics, not counted)."""
        return sum(int(np.prod(s.shape)) for s in self.param_specs(input_shape).values() if s.trainable)

    num_parameters = num_params

    # -- parameters --------------------------------------------------------------------------------
    def init(self, seed: int = 0, dtype: str = "float32", input_shape: Sequence[int] | None = None) -> "Network":
        """Initialize every parameter from a seeded generator, as each layer asks (by default He for
        convolutions, Glorot for linear layers; ``Conv2d(..., init=)`` and ``Linear(..., init=)`` choose)."""
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
    elif spec.init == "he_out":
        arr = rng.standard_normal(spec.shape) * np.sqrt(2.0 / spec.fan_out)
    elif spec.init == "small":
        arr = rng.standard_normal(spec.shape) * 0.01
    elif spec.init == "glorot":
        bound = np.sqrt(6.0 / (spec.fan_in + spec.fan_out))
        arr = rng.uniform(-bound, bound, spec.shape)
    elif spec.init == "normal":
        arr = rng.standard_normal(spec.shape) / np.sqrt(spec.fan_in)
    elif spec.init == "zeros":
        arr = np.zeros(spec.shape)
    elif spec.init == "value":
        arr = np.asarray(spec.value)
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

    def add_input(self, shape: Sequence[int], name: str) -> Node:
        """Another input of the network, of ``shape`` without the batch axis (a mask beside token ids):
        ``Trainer.step`` and ``predict`` then take a tuple of arrays, one per input in the order they were
        added (``g.input`` first)."""
        if not name or name == self._nodes[0].name or name in self._taken:
            raise ValueError(f"{self.name}: an input needs a name of its own, not {name!r}")
        shape = tuple(int(d) for d in shape)
        if any(d < 1 for d in shape):
            raise ValueError(f"{self.name}: input {name!r} has shape {shape}; every axis must be at least 1")
        node = self._append(Node(self, len(self._nodes), None, (), name))
        self._input_shapes[node.index] = shape
        self._built.clear()
        return node

    def split(self, node: Node, sections: int, axis: int = 1, name: str | None = None) -> list[Node]:
        """``sections`` equal pieces of ``node`` along ``axis``: one :class:`~vmem.nn.Split` op per piece."""
        from ..nn.seq import Split

        return [self.add(Split(sections, i, axis), node, name=f"{name}.{i}" if name else None) for i in range(sections)]

    def reuse(self, layer: Layer, *inputs: Node, name: str | None = None) -> Node:
        """Apply ``layer``, already in the graph, again: the new op shares its parameters (an unrolled
        recurrence: every time step's gradient is summed into one). ``name``: the new op's name (default
        ``"<layer>@<n>"``)."""
        if not self._uses[id(layer)]:
            raise ValueError(f"{self.name}: reuse() applies a layer already in the graph; add {layer!r} first")
        if not inputs:
            raise ValueError(f"{self.name}: {layer.label} needs at least one input node")
        for node in inputs:
            if not isinstance(node, Node) or node.graph is not self:
                raise ValueError(f"{self.name}: inputs of {layer.label} must be nodes of this network")
        alias = name or f"{layer.name}@{self._uses[id(layer)]}"
        if alias in self._taken:
            raise ValueError(f"{self.name}: two layers are named {alias!r}")
        node = self._append(Node(self, len(self._nodes), layer, tuple(inputs), alias))
        self._output = node
        self._built.clear()
        return node

    def output(self, node: Node) -> None:
        if node.graph is not self:
            raise ValueError(f"{self.name}: the output must be a node of this network")
        self._output = node
        self._built.clear()
