"""The layer protocol: shapes, parameters, math on an array namespace, and what backward needs.

Layers are pure math. They never allocate device memory and know nothing of offloading: the executor
hands them every buffer (outputs, gradients, saved state, workspace) and the graph reads their
declarations to decide what must be kept for backward.

Layout. Shapes in the public API are NCHW (``(N, C, H, W)``). On a device, 4-D tensors are stored
channels-last, ``(N, H, W, C)``: :func:`physical` maps one to the other. Layers compute on the physical
arrays. Convolution filters are stored ``(K, kh, kw, C)`` (cuDNN's NHWC filter layout, "KRSC"); Linear
weights ``(out, in)``.

What backward needs (``Layer.needs``): ``"x"`` the layer's inputs, ``"y"`` its output, ``"mask"`` only
the sign of its output (ReLU: 1 bit would do), or nothing. Saved state a layer makes itself (an argmax map,
a dropout mask, batch statistics) is declared by ``aux_specs`` and handed to it as ``ctx.aux``.

Replays. A forward may run twice in one training step (``ctx.replay``): the second run must write the
same output bit for bit and change nothing else. Layers with randomness reuse their saved state; layers
that update buffers (running statistics) leave them alone.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence, TYPE_CHECKING

import numpy as np

from ..errors import ShapeError
from .ops import HostOps

if TYPE_CHECKING:
    from .._typing import Array
    from .._typing import Xp

__all__ = ["Layer", "Ctx", "Shape", "physical", "logical", "ParamSpec", "AuxSpec", "PASSES"]

Shape = tuple[int, ...]

#: The passes of a layer that may offer a choice of algorithms (convolution), each with its own workspace.
PASSES = ("forward", "backward_data", "backward_filter")


def physical(shape: Shape) -> Shape:
    """The device layout of a logical shape: NCHW -> NHWC for 4-D tensors, others unchanged."""
    if len(shape) == 4:
        n, c, h, w = shape
        return (n, h, w, c)
    return tuple(shape)


def logical(shape: Shape) -> Shape:
    """Inverse of :func:`physical`."""
    if len(shape) == 4:
        n, h, w, c = shape
        return (n, c, h, w)
    return tuple(shape)


#: the initializers a layer's weights may ask for (``Conv2d(..., init=)``, ``Linear(..., init=)``):
#: he N(0, 2/fan_in); he_out N(0, 2/fan_out) (torchvision's VGG and ResNet convolutions); glorot
#: U(+-sqrt(6/(fan_in+fan_out))); normal N(0, 1/fan_in); small N(0, 0.01^2) (torchvision's VGG classifier)
WEIGHT_INITS = ("he", "he_out", "glorot", "normal", "small")


def check_init(layer: str, init: str) -> str:
    """``init`` if it names one of :data:`WEIGHT_INITS`, else a ValueError naming the layer kind."""
    if init not in WEIGHT_INITS:
        raise ValueError(f"{layer}: init={init!r} is not an initializer; choose one of {', '.join(WEIGHT_INITS)}")
    return init


@dataclass(frozen=True)
class ParamSpec:
    """A trainable parameter (or, with ``trainable=False``, a state buffer such as running statistics)."""

    shape: Shape
    init: str  # one of WEIGHT_INITS, "zeros", "ones", or "value" (``value``, a constant the layer holds)
    fan_in: int = 1
    fan_out: int = 1
    trainable: bool = True
    value: Any = field(default=None, compare=False, repr=False)  # for init="value": the array (physical shape)


@dataclass(frozen=True)
class AuxSpec:
    """State a layer saves in forward for its own backward (physical shape)."""

    shape: Shape
    dtype: str  # "float" means the network's float dtype (float32 under mixed precision: statistics stay float32)


@dataclass
class Ctx:
    """Everything one forward or backward call may touch, handed in by the executor."""

    xp: Xp
    params: dict[str, Any] = field(default_factory=dict)
    grads: dict[str, Any] = field(default_factory=dict)
    aux: dict[str, Any] = field(default_factory=dict)
    train: bool = True
    rng: Any = None
    workspace: Array | None = None  # a uint8 array, at least the pass's workspace (the op's catalog) long, or None
    #: the convolution algorithm of this pass; a backward's (backward-data, backward-filter) pair
    algo: str | tuple[str, str] | None = None
    in_shapes: tuple[Shape, ...] = ()  # physical shapes of the inputs
    conv: Any = None  # the device's convolution backend (the host's on the CPU, cuDNN's on CUDA): Conv2d's passes
    #: how the device runs array work: products, work over rows, column sums (:mod:`vmem.nn.ops`);
    #: NumPy, in turn, unless the device says otherwise
    ops: Any = field(default_factory=HostOps)
    #: a second forward of the same step (to rebuild an output backward reads): reuse the saved state
    #: (dropout's mask), update nothing (batch norm's running statistics), and write the same output
    replay: bool = False
    #: the layer's output goes through ReLU in the same pass (a convolution whose output a ReLU overwrites in
    #: place: the executor runs that ReLU here, after the bias, and skips its own forward)
    relu: bool = False
    #: the output of the ReLU before this layer, whose backward runs in this layer's (max pooling over an
    #: in-place ReLU's output, its only reader): the backward then writes ``dx * (relu_output > 0)``, the
    #: ReLU's input gradient, and the executor skips the ReLU's backward; None otherwise
    relu_output: Array | None = None
    #: where the batch is split over several processes (data-parallel training with synchronized batch
    #: norm): sums an array over them, in place, every process calling it in the same order; None: this
    #: process holds the whole batch
    batch_sum: Any = None


class Layer(ABC):
    """Base class of every layer. Subclasses set the class attributes and override what they need."""

    kind: ClassVar[str] = "layer"
    needs: ClassVar[frozenset[str]] = frozenset()  # subset of {"x", "y", "mask"}
    inplace: ClassVar[bool] = False  # may write its output over its (single) input
    arity: ClassVar[int | None] = 1  # number of inputs; None: two or more
    reads_ids: ClassVar[bool] = False  # its input holds integer ids (kept exact: never stored in half precision)
    #: the positions of its inputs that hold integers (kept exact) where only some do (a step's lengths)
    id_inputs: ClassVar[tuple[int, ...]] = ()

    def __init__(self) -> None:
        self.name: str | None = None

    # -- shapes ------------------------------------------------------------------------------------
    def output_shape(self, in_shapes: Sequence[Shape]) -> Shape:
        """Logical (NCHW) output shape for logical input shapes; raises ShapeError."""
        return tuple(in_shapes[0])

    def output_dtype(self, in_dtypes: Sequence[str], dtype: str) -> str:
        """What the output is stored in, given the inputs' dtypes and the network's ``dtype``: the network's,
        unless the layer says otherwise (a layer that only reshapes keeps its input's)."""
        return dtype

    def check_arity(self, in_shapes: Sequence[Shape]) -> None:
        n = len(in_shapes)
        if self.arity is None:
            if n < 2:
                raise ShapeError(f"layer {self.label}: needs two or more inputs, got {n}")
        elif n != self.arity:
            raise ShapeError(f"layer {self.label}: needs {self.arity} input(s), got {n}")

    def expect_rank(self, shape: Shape, rank: int, what: str = "input") -> None:
        if len(shape) != rank:
            layout = {4: "(N, C, H, W)", 2: "(N, features)"}.get(rank, f"rank {rank}")
            raise ShapeError(f"layer {self.label}: expects a {layout} {what}, got shape {tuple(shape)}")

    def aliases(self, in_shapes: Sequence[Shape]) -> bool:
        """Whether the output may be written over the (single) input for these logical input shapes:
        ``inplace``, unless the layer says otherwise for some shapes (a reshape that changes the stored
        order of the values copies)."""
        return self.inplace

    # -- parameters and saved state -----------------------------------------------------------------
    def param_specs(self, in_shapes: Sequence[Shape]) -> dict[str, ParamSpec]:
        return {}

    def aux_specs(self, in_shapes: Sequence[Shape]) -> dict[str, AuxSpec]:
        return {}

    # -- cost ------------------------------------------------------------------------------------
    def flops(self, in_shapes: Sequence[Shape]) -> int:
        """Floating-point operations of forward (backward is counted by the caller as about 2x)."""
        return int(np.prod(self.output_shape(in_shapes)))

    # -- math ------------------------------------------------------------------------------------
    @abstractmethod
    def forward(self, ctx: Ctx, xs: list[Array], y: Array) -> None:
        """Compute the output into ``y`` (physical layout) from inputs ``xs``."""

    @abstractmethod
    def backward(self, ctx: Ctx, dy: Array, xs: list[Array] | None, y: Array | None, dxs: list[Array | None]) -> None:
        """Write input gradients into the non-None entries of ``dxs`` and parameter gradients into
        ``ctx.grads``. ``xs``/``y`` are given only if declared in ``needs``. ``dxs[i]`` may be ``dy``
        itself when the executor runs the layer's backward in place."""

    # -- naming ------------------------------------------------------------------------------------
    @property
    def label(self) -> str:
        return f"{self.name!r} ({type(self).__name__})" if self.name else type(self).__name__

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.extra_repr()})"
