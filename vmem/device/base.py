"""The Device protocol: everything the runtime (executor, codecs, benchmarks, trainer) asks of a device.

Three devices implement it: the CPU device (real data in a host arena, worker-thread streams), the
simulated GPUs (shapes only, virtual streams) and the CUDA device. Nothing in vmem probes a device for
optional methods: what is here, every device has; a device that cannot do something (a simulated GPU
holds no data) raises :class:`~vmem.errors.DeviceError` saying so. tests/device/test_protocol.py runs
one suite over every device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ContextManager, Protocol, runtime_checkable

from ..pool import Block, DevicePool, PinnedHostPool
from ..streams import Stream
from .spec import DeviceSpec

if TYPE_CHECKING:
    from .._typing import Array, ShapeLike
    from ..codecs.base import Codec
    from numpy.typing import DTypeLike
    from ..graph.program import Program
    from .._typing import Xp
    from ..nn.base import Ctx
    from ..nn.conv import Conv2d
    from ..nn.ops import ArrayOps

__all__ = ["Capturing", "Device", "DeviceSpec", "ConvBackend", "Graph"]


@runtime_checkable
class ConvBackend(Protocol):
    """A device's convolutions (the host's on the CPU device, cuDNN's on a GPU): ``Conv2d`` hands its passes
    to it (``ctx.conv``) and a profile asks it what to time. Tensors are channels last, filters KRSC; a pass's algorithm is a name
    from the program's catalog (``ctx.algo``; backward: a pair (backward_data, backward_filter))."""

    #: how many of :meth:`heuristic`'s algorithms per pass a profile times
    ranked_top: int

    def catalog(self, program: Program) -> Program:
        """``program`` whose convolutions offer this backend's algorithms, with their exact workspace bytes."""
        ...

    def forward(self, layer: "Conv2d", ctx: "Ctx", x: Array, w: Array, y: Array, b: Array = None) -> None:
        """``y = conv(x, w)``, plus the bias ``b`` where given, then ReLU over ``y`` where ``ctx.relu``."""
        ...

    def backward(
        self,
        layer: "Conv2d",
        ctx: "Ctx",
        dy: Array,
        x: Array | None,
        w: Array,
        dx: Array | None,
        dw: Array | None,
        db: Array | None = None,
    ) -> None:
        """The bias's gradient ``db`` if given, the filters' ``dw`` unless it is None (``x`` is then
        given), and ``dx`` unless it is None (a split backward runs the two halves as two calls)."""
        ...

    def heuristic(
        self, layer: "Conv2d", pass_: str, x_shape: tuple[int, ...], y_shape: tuple[int, ...], dtype: str = "float32"
    ) -> list[str]:
        """The pass's algorithms on maps stored in ``dtype`` ranked best first without running them; empty
        where the backend has no
        ranking of its own (a profile then times them all through :meth:`find`)."""
        ...

    def find(
        self, layer: "Conv2d", pass_: str, x: Array, w: Array, y: Array, ws: Array
    ) -> list[tuple[str, float, int]]:
        """Every algorithm of the pass timed on these buffers: (name, seconds, workspace bytes), fastest first."""
        ...


class Graph(Protocol):
    """A step recorded by :meth:`Device.capture`: ``launch`` enqueues all of it on a stream; ``ran`` says it
    has run once and the device was synchronized after (its capture's events are then complete); ``close``
    gives back what it holds."""

    def launch(self, stream: Stream) -> None: ...

    def ran(self) -> None: ...

    def close(self) -> None: ...


class Capturing(Protocol):
    """What :meth:`Device.capture` gives: ``graph`` set once the capture has ended without an error."""

    @property
    def graph(self) -> Graph | None: ...


@runtime_checkable
class Device(Protocol):
    """A device: a pool over its memory, a pinned host pool, a compute and a memory stream.

    Arrays on the device are views of pool blocks (``view``); host buffers for offload are views of
    pinned blocks (``host_view``). ``copy_to_host``/``copy_to_device`` enqueue a copy on a stream (the
    memory stream by default) and return at once; ``copy_now`` copies on the calling thread, for work
    already running on a stream. ``holds_data`` is False for a device that only plans (simulated).
    A device whose streams run their work after ``launch`` returns (a GPU) says so with a true
    ``asynchronous`` attribute: the executor then times its spans with timing events and makes streams wait
    for each other without the host.
    """

    name: str
    kind: str  # "cpu" | "sim" | "cuda"
    spec: DeviceSpec
    holds_data: bool
    pool: DevicePool
    asynchronous: bool  # work runs after launch returns (a GPU): spans timed by events, streams wait on the device
    #: a training step is recorded once as a CUDA graph and replayed by one launch (the CUDA device's
    #: ``graphs="on"``; see :meth:`capture`)
    graphs: bool
    #: the device makes a float32 NCHW batch channels last itself (the CUDA device: one kernel), so the executor
    #: stages and copies such a batch as it is; elsewhere the host transposes and casts it
    nchw_inputs: bool

    @property
    def xp(self) -> Xp:
        """The array module (numpy, cupy; a simulated device, which holds no data, names NumPy)."""
        ...

    @property
    def ops(self) -> ArrayOps | None:
        """How the layers' array work runs here (:mod:`vmem.nn.ops`: products, work over rows, column sums);
        None on a device that runs nothing (simulated)."""
        ...

    @property
    def compute_stream(self) -> Stream: ...

    @property
    def memory_stream(self) -> Stream: ...

    @property
    def conv_backend(self) -> ConvBackend | None:
        """The device's convolutions (host's, cuDNN's); None: it runs none (simulated)."""
        ...

    @property
    def pinned(self) -> PinnedHostPool | None:
        """The pinned host pool for offloaded buffers (None on a device that holds no data)."""
        ...

    @property
    def closed(self) -> bool: ...

    def catalog(self, program: Program) -> Program:
        """``program`` with the convolution algorithms this device offers and their workspace sizes."""
        ...

    def reserve_pinned(self, nbytes: int) -> PinnedHostPool:
        """Make sure the pinned pool holds at least ``nbytes`` (before a step, never inside one), the last
        step's returned buffers coalesced."""
        ...

    def view(self, block: Block, shape: ShapeLike, dtype: DTypeLike) -> Array:
        """An array over a device block."""
        ...

    def host_view(self, block: Block, shape: ShapeLike, dtype: DTypeLike) -> Array:
        """A host array over a pinned block."""
        ...

    def copy_to_host(self, dst: Array, src: Array, stream: Stream | None = None) -> None: ...

    def copy_to_device(self, dst: Array, src: Array, stream: Stream | None = None) -> None: ...

    def copy_now(self, dst: Array, src: Array, direction: str) -> None:
        """Copy at once on the calling thread (``"d2h"`` or ``"h2d"``), for work running on a stream."""
        ...

    def runs_codec(self, codec: Codec) -> bool:
        """Whether this device's kernels can run ``codec`` (a :class:`~vmem.codecs.Codec`)."""
        ...

    def device_array(self, x: object) -> Array | None:
        """``x`` as an array of this device without a copy, where it is one (on a GPU: a CuPy array, an object
        with ``__cuda_array_interface__`` or a DLPack tensor on this GPU), its producer's pending work waited
        for; None for anything else (host arrays: the CPU device's arrays are host arrays)."""
        ...

    def release_cached(self) -> None:
        """Give back what the device's array library caches outside the pool (CuPy's blocks on a GPU),
        after waiting for both streams; nothing to do elsewhere."""
        ...

    def readings(self) -> dict[str, Any]:
        """The device's own readings now (NVML on a GPU); empty where there are none."""
        ...

    def link_stats(self) -> dict[str, dict[str, float]]:
        """Bytes moved and seconds spent over the host link in each direction (``"d2h"``, ``"h2d"``)."""
        ...

    def new_stream(self, name: str) -> Stream:
        """Another stream of the device's kind (the communication stream of a data-parallel run); its
        owner closes it."""
        ...

    def synchronize(self) -> None:
        """Wait for both streams; re-raise the first error their work raised."""
        ...

    def step_scope(self) -> ContextManager[Any]:
        """The context a step (or a profiling run) runs in. The CPU device caps its host threads to the
        core budget there (:data:`vmem.threads.BUDGET`); other devices need nothing."""
        ...

    def dispatch_scope(self) -> ContextManager[Any]:
        """The context the host enqueues one step's work in. On the CPU device, whose stream workers
        share the interpreter's lock with the host, the workers sleep until the step is enqueued (or a
        thread waits for their progress); other devices need nothing."""
        ...

    def capture(self) -> ContextManager[Capturing]:
        """Where ``graphs`` is true: a context in which the work enqueued on the compute and memory streams
        is recorded, not run; its value's ``graph`` (set when the block ends without an error) replays it
        with ``launch(stream)``. Other devices refuse (DeviceError)."""
        ...

    def close(self) -> None:
        """Finish outstanding work; stop every thread the device or its codecs started (idempotent)."""
        ...

    def __enter__(self) -> "Device": ...

    def __exit__(self, *exc: object) -> None: ...
