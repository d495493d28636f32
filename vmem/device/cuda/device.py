"""The CUDA device: CuPy arrays in one device arena, non-blocking compute and memory streams, an
exact-size pinned pool, cuDNN convolutions, the encoding kernels compiled for the GPU.

``vmem.device("cuda:0", memory="8GiB")``; without ``memory=`` the capacity is the free memory the driver
reports less ``reserve``, as the repr says. The reserve (default: the larger of 2 GiB and 5% of the GPU) holds
what vmem cannot route through its pool: the CUDA context, the kernels cuDNN, cuBLAS and CuPy load when first
used, their handles and workspaces, and CuPy's temporaries (below).

CuPy's own temporaries (element-wise results such as ReLU's ``y > 0``, reductions) are not in a plan. By
default (``temporaries="reserve"``) they come from CuPy's pool, inside the reserve, so the arena holds
exactly what the plan predicts. ``temporaries="pool"`` routes them through the device pool (category
``other``) while work runs on the device's streams, so that nothing escapes the accounting; the measured
peak then exceeds the plan's by what the temporaries take.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ... import threads
from ...errors import DeviceError
from ..kernel_ops import KernelOps
from ...pool import Block, DevicePool, PinnedHostPool, PoolHook
from ...units import format_bytes, parse_bytes
from ..spec import DeviceSpec, check_math
from .memory import DeviceArena, PinnedArena, PoolAllocator
from .streams import CudaStream, EventPool

if TYPE_CHECKING:
    from ..._typing import Array, ShapeLike
    from ..._typing import GpuArray
    from ...codecs.base import Codec
    from numpy.typing import DTypeLike
    from ...graph.program import Program
    from .graphs import Capture
    from ...streams.base import Stream

__all__ = ["CudaDevice"]

POISON_BYTE = 0xFF
_DEFAULT_PINNED = 64 << 20
_D2H, _H2D = 2, 1  # cudaMemcpyKind


class _Poison(PoolHook):
    """Fill freed blocks with ``POISON_BYTE`` on the stream they were freed on; a block freed without one
    (between steps, after a synchronize) on the compute stream, which every later use of it follows:
    never the legacy default stream, which the non-blocking streams do not wait for."""

    def __init__(self, arena: DeviceArena, default: CudaStream):
        self.arena = arena
        self.default = default

    def on_free(self, block: Block, stream: Stream | None) -> None:
        self.arena.fill(block.offset, block.size, POISON_BYTE, cast(CudaStream, stream or self.default).stream)


def _on_cuda_dlpack(x: object) -> bool:
    """Whether ``x`` is a DLPack tensor on a CUDA device (kDLCUDA = 2, kDLCUDAManaged = 13)."""
    where = getattr(x, "__dlpack_device__", None)
    if where is None:
        return False
    try:
        return int(where()[0]) in (2, 13)
    except Exception:  # noqa: BLE001 - not a DLPack tensor after all
        return False


class CudaDevice:
    """A CUDA GPU behind the Device protocol (see the module docstring). ``deterministic`` keeps cuDNN's
    atomics-based algorithms out of the catalog, so that lossless policies stay bitwise. ``conv_api``:
    convolutions through cuDNN's legacy API (its algorithms) or its graph API (its engines; a convolution and
    the in-place ReLU after it one fused graph with the bias: :mod:`.graph_conv`). ``nchw=True``
    also offers each legacy algorithm on NCHW copies of the channels-last tensors (``nchw.<algo>``: cuDNN
    has more, and faster, FP32 algorithms for NCHW; the copies are part of the algorithm's workspace).
    ``math``: how FP32 convolutions compute, ``"tf32"`` (the default, as PyTorch's) or ``"exact"`` (FMA; see
    :data:`vmem.device.spec.MATH_MODES`). ``graphs="on"``: a training step that repeats (the same batch
    shape and loss scale, the pool as the last step left it) is recorded once as a CUDA
    graph and replayed by one launch, the same bits as without (:mod:`vmem.runtime.graphs`); a step that
    cannot be captured runs as it is and the trainer says why. Off by default until the GPU check has
    measured it faster."""

    kind = "cuda"
    holds_data = True
    #: work runs on the GPU after ``launch`` returns: the executor times spans with events, and streams
    #: wait for each other on the GPU, not on the host
    asynchronous = True
    #: a float32 NCHW batch is copied as it is and made channels last on the GPU by one kernel
    nchw_inputs = True

    def __init__(
        self,
        index: int = 0,
        *,
        memory: int | str | None = None,
        reserve: int | str | None = None,
        pinned_memory: int | str | None = None,
        poison: bool = False,
        alignment: int = 256,
        deterministic: bool = True,
        temporaries: str = "reserve",
        conv_api: str = "legacy",
        nchw: bool = False,
        math: str = "tf32",
        graphs: str | bool = "off",
    ):
        check_math(f"cuda:{index}", math)  # before any memory is taken
        if conv_api not in ("legacy", "graph"):
            raise DeviceError(
                f"cuda:{index}: conv_api={conv_api!r}; use 'legacy' (cuDNN's algorithms) or 'graph' "
                "(cuDNN's graph API and its engines)"
            )
        if temporaries not in ("reserve", "pool"):
            raise DeviceError(f"cuda:{index}: temporaries={temporaries!r}; use 'reserve' or 'pool'")
        on = {"on": True, "off": False, True: True, False: False}.get(graphs)  # type: ignore[call-overload]
        if on is None:
            raise DeviceError(f"cuda:{index}: graphs={graphs!r}; use 'on' or 'off'")
        if on and temporaries == "pool":  # a graph's temporaries must stay its own (vmem.device.cuda.graphs)
            raise DeviceError(
                f"cuda:{index}: graphs='on' needs temporaries='reserve': with 'pool' the temporaries a graph "
                "captured would be handed to other work from the device pool while the graph still writes them"
            )
        #: training steps recorded as CUDA graphs and replayed (see the class docstring)
        self.graphs = on
        self.conv_api = conv_api
        self.nchw = bool(nchw)
        import cupy

        self.index = index
        self._cuda = cupy.cuda.Device(index)
        self._cuda.use()
        props = cupy.cuda.runtime.getDeviceProperties(index)
        self.gpu = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        self.arch = f"sm_{props['major']}{props['minor']}"
        free, total = cupy.cuda.runtime.memGetInfo()
        self.reserve = max(2 << 30, total // 20) if reserve is None else parse_bytes(reserve, name="reserve")
        #: the arena's capacity when none is given: free memory less the reserve
        self.free_capacity = free - self.reserve
        capacity = self.free_capacity if memory is None else parse_bytes(memory, name="memory")
        if capacity <= 0 or capacity > free:
            raise DeviceError(
                f"cuda:{index}: memory={format_bytes(capacity)} does not fit the "
                f"{format_bytes(free)} free of {format_bytes(total)} on {self.gpu}"
            )
        self.name = f"cuda:{index}"
        self.xp = cupy
        # one call per operation (ReLU through vmem's kernels, in place); column sums in blocks of rows
        self.ops = KernelOps(cupy)
        self.poison = bool(poison)
        self.deterministic = bool(deterministic)
        self.pool = DevicePool(capacity, alignment, DeviceArena, name=f"{self.name} device")
        self.spec = DeviceSpec(name=self.name, kind="cuda", memory=self.pool.capacity, arch=self.arch, math=math)
        self.events = EventPool()  # every stream's events: made once, recorded again once dropped
        self.compute_stream = CudaStream("compute", self.events)
        self.memory_stream = CudaStream("memory", self.events)
        if self.poison:
            self.pool.add_hook(_Poison(self.pool.arena, self.compute_stream))
        self._streams = {s.ptr: s for s in (self.compute_stream, self.memory_stream)}
        self.temporaries = temporaries
        if temporaries == "pool":
            self._allocator = PoolAllocator(self.pool, self.pool.arena, self._streams.get)
            routed = cupy.cuda.PythonFunctionAllocator(self._allocator.malloc, self._allocator.free)
            for stream in self._streams.values():
                stream.allocator = routed
        self._pinned: PinnedHostPool | None = None
        self._pinned_capacity = _DEFAULT_PINNED if pinned_memory is None else parse_bytes(pinned_memory)
        self._pinned_fixed = pinned_memory is not None
        self._moved = {"d2h": 0, "h2d": 0}
        self._conv: Any = None
        self._sampler: Any = None  # NVML's readings, sampled off the step's path (made on first use)
        from ...codecs import native
        from .kernels import backend_of

        native.register_gpu(backend_of)  # the codecs find a CuPy array's kernels through it
        self._closed = False
        threads.hold()
        self._release_threads = weakref.finalize(self, threads.release)

    # -- backends ----------------------------------------------------------------------------------
    @property
    def conv_backend(self) -> Any:
        """cuDNN convolutions on this device (made on first use): the legacy API's algorithms, or with
        ``conv_api="graph"`` the engines of cuDNN's graph API (:class:`~.graph_conv.GraphConv`)."""
        if self._conv is None:
            from .conv import CudnnConv
            from .graph_conv import GraphConv

            self._conv = (GraphConv if self.conv_api == "graph" else CudnnConv)(self)
        return self._conv

    @property
    def kernels(self) -> Any:
        """The encoding kernels compiled for this GPU (made on first use; the codecs' backend shares them)."""
        from .kernels import backend_for_device

        return backend_for_device(self.index).module

    def catalog(self, program: Program) -> Program:
        """``program`` with cuDNN's convolution algorithms on this GPU and their exact workspace sizes. Over
        fp16/bf16 storage the kinds in :data:`~vmem.device.staging.CUDA_NATIVE` compute as they are stored
        (convolutions in cuDNN's pseudo-half through either API, linear layers on cuBLAS with FP32
        accumulation, their weights' half copies in their workspace); the rest compute in float32 through staging copies in their workspace (as on the CPU
        device: :mod:`vmem.device.staging`), each output rounded once."""
        from ..kernel_ops import with_linear_copies
        from ..staging import CUDA_NATIVE, with_float32_compute

        return with_linear_copies(with_float32_compute(program, self.conv_backend.catalog, CUDA_NATIVE))

    # -- memory ------------------------------------------------------------------------------------
    @property
    def pinned(self) -> PinnedHostPool:
        if self._pinned is None:
            self._pinned = PinnedHostPool(
                self._pinned_capacity, self.pool.alignment, PinnedArena, name=f"{self.name} pinned"
            )
        return self._pinned

    def reserve_pinned(self, nbytes: int) -> PinnedHostPool:
        pool = self._pinned
        if pool is not None and pool.capacity >= nbytes:
            pool.reclaim()  # the last step's returns, coalesced before this step's exact fit
            return pool
        if pool is not None:
            pool.require_idle(nbytes)
            self._pinned = None
        self._pinned_capacity = max(nbytes, self._pinned_capacity if self._pinned_fixed else 0)
        return self.pinned

    def view(self, block: Block, shape: ShapeLike, dtype: DTypeLike) -> Array:
        return self.pool.view(block, shape, dtype)

    def host_view(self, block: Block, shape: ShapeLike, dtype: DTypeLike) -> np.ndarray:
        return self.pinned.view(block, shape, dtype)

    def is_pinned(self, array: np.ndarray) -> bool:
        if self._pinned is None:
            return False
        lo = self._pinned.arena.ptr
        start = array.__array_interface__["data"][0]
        return lo <= start and start + array.nbytes <= lo + self._pinned.capacity

    # -- copies ------------------------------------------------------------------------------------
    def copy_to_host(self, dst: np.ndarray, src: GpuArray, stream: Stream | None = None) -> None:
        self._copy(dst, src, cast(CudaStream, stream or self.memory_stream), "d2h")

    def copy_to_device(self, dst: GpuArray, src: np.ndarray, stream: Stream | None = None) -> None:
        self._copy(dst, src, cast(CudaStream, stream or self.memory_stream), "h2d")

    def _copy(self, dst: GpuArray, src: GpuArray, stream: CudaStream, direction: str) -> None:
        host = dst if direction == "d2h" else src
        if dst.nbytes != src.nbytes or not (dst.flags.c_contiguous and src.flags.c_contiguous):
            raise ValueError(
                f"{direction} copy: both sides must be C-contiguous and of the same size "
                f"({dst.shape} {dst.dtype} <- {src.shape} {src.dtype})"
            )
        self._memcpy(dst, src, direction, stream.ptr)
        if not self.is_pinned(host):  # pageable: staged by the driver; the host waits, as on the CPU device
            stream.synchronize()

    def copy_now(self, dst: GpuArray, src: GpuArray, direction: str) -> None:
        """Copy on the current stream (inside work launched on a stream: that stream)."""
        import cupy

        self._memcpy(dst, src, direction, cupy.cuda.get_current_stream().ptr)

    def _memcpy(self, dst: GpuArray, src: GpuArray, direction: str, stream_ptr: int) -> None:
        import cupy

        if direction == "d2h":
            cupy.cuda.runtime.memcpyAsync(dst.ctypes.data, src.data.ptr, dst.nbytes, _D2H, stream_ptr)
        else:
            cupy.cuda.runtime.memcpyAsync(dst.data.ptr, src.ctypes.data, dst.nbytes, _H2D, stream_ptr)
        self._moved[direction] += dst.nbytes

    def readings(self) -> dict[str, Any]:
        """NVML's latest readings of this GPU (memory the driver sees in use, PCIe throughput and link),
        sampled by a thread of their own every 0.1 s, so that a step never waits for NVML."""
        from . import nvml

        if self._sampler is None:
            index = self.index
            self._sampler = nvml.Sampler(lambda: nvml.reading(index), name=f"vmem-nvml-{self.name}")
        return self._sampler.latest()

    def link_stats(self) -> dict[str, dict[str, float]]:
        """Bytes enqueued over the host link each way (times come from the timeline's events)."""
        return {d: {"bytes": b, "seconds": 0.0} for d, b in self._moved.items()}

    def new_stream(self, name: str) -> CudaStream:
        """Another non-blocking CUDA stream (its owner closes it), work on it allocating from the device's
        pool as the others' does."""
        stream = CudaStream(name, self.events)
        stream.allocator = self.compute_stream.allocator
        self._streams[stream.ptr] = stream  # temporaries made while its work runs are freed in its order
        return stream

    # -- lifetime ----------------------------------------------------------------------------------
    def synchronize(self) -> None:
        for stream in (self.compute_stream, self.memory_stream):
            stream.synchronize()

    def runs_codec(self, codec: Codec) -> bool:
        """The codecs whose kernels have a GPU build (zvc, ssdc, binarize, dpr)."""
        return bool(codec.gpu)

    def device_array(self, x: object) -> GpuArray | None:
        """``x`` as a CuPy array on this GPU without a copy: a CuPy array, an object with
        ``__cuda_array_interface__`` (a PyTorch CUDA tensor), a DLPack tensor on a CUDA device; None for a
        host array or anything else. The current stream, on which its producer ran, is waited for (vmem's
        streams do not wait for it); an array of another GPU is refused."""
        import cupy

        if isinstance(x, np.ndarray) or not (
            isinstance(x, cupy.ndarray) or hasattr(x, "__cuda_array_interface__") or _on_cuda_dlpack(x)
        ):
            return None
        arr = (
            x
            if isinstance(x, cupy.ndarray)
            else (cupy.asarray(x) if hasattr(x, "__cuda_array_interface__") else cupy.from_dlpack(x))
        )
        if int(arr.device.id) != self.index:
            raise DeviceError(f"{self.name}: an input array lives on cuda:{int(arr.device.id)}, not on this GPU")
        cupy.cuda.get_current_stream().synchronize()
        return arr

    def release_cached(self) -> None:
        """Wait for both streams, then give the blocks CuPy's pool caches (the temporaries of work done
        so far) back to the driver, so that the reserve is whole again (the profile does this between
        layers: a temporary of a large batch's feature map is a gigabyte)."""
        import cupy

        self.synchronize()
        cupy.get_default_memory_pool().free_all_blocks()

    def step_scope(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def capture(self) -> Capture:
        """A stream capture of the compute and memory streams (:class:`~.graphs.Capture`)."""
        if not self.graphs:
            raise DeviceError(f"{self.name}: graphs are off (vmem.device('{self.name}', graphs='on'))")
        from .graphs import Capture

        return Capture(self)

    def dispatch_scope(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.synchronize()
        finally:
            if self._sampler is not None:
                self._sampler.close()
            if self._conv is not None:
                self._conv.close()
            for s in (self.compute_stream, self.memory_stream):
                s.close()
            self.pool.arena.release()  # the arena goes back to the driver once its last view is gone
            self._release_threads()

    def __enter__(self) -> "CudaDevice":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"CudaDevice({self.name}: {self.gpu} {self.arch}, memory={format_bytes(self.pool.capacity)}, "
            f"reserve={format_bytes(self.reserve)} for the CUDA context, cuDNN and cuBLAS"
            f"{', poison' if self.poison else ''}{', cuDNN graph API' if self.conv_api == 'graph' else ''}"
            f"{', NCHW algorithms too' if self.nchw else ''})"
        )
