"""The CPU device: real numerics, real asynchronous streams, a fixed-capacity device arena.

"Device memory" is one NumPy buffer of ``memory`` bytes carved by a :class:`~vmem.pool.DevicePool`;
arrays are views into it. The compute and memory streams are :class:`~vmem.streams.CpuStream` worker
threads. Host-device copies run on a stream for real; ``pcie_gbps`` throttles them to a link rate, one
transfer at a time in each direction (PCIe is full duplex, with one copy engine per direction).

Copies whose host side is not in the pinned pool behave as pageable copies do under CUDA: they are
staged through a bounce buffer and the host waits for them.

With ``poison=True`` every freed block is filled with 0xFF bytes (NaN for floating-point data) in
stream order, so that a stream-ordering bug corrupts results here exactly as it would on a GPU.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any, TYPE_CHECKING, NoReturn

import numpy as np

from .. import threads
from ..errors import DeviceError
from ..pool import Block, DevicePool, HostArena, PinnedHostPool, PoolHook
from ..streams import CpuStream
from ..streams.cpu import held
from ..units import format_bytes, parse_bytes
from .hostconv import HostConv
from .lanes import LaneOps
from .staging import cpu_catalog
from .spec import DeviceSpec, check_math

if TYPE_CHECKING:
    from .._typing import ShapeLike
    from ..codecs.base import Codec
    from numpy.typing import DTypeLike
    from ..graph.program import Program
    from ..streams.base import Stream

__all__ = ["CpuDevice"]

POISON_BYTE = 0xFF  # every float format reads 0xFF...FF as NaN; integers read -1
_CHUNK = 1 << 20  # throttled and staged copies move this many bytes at a time
_DEFAULT_PINNED = 64 << 20  # pinned pool made on first use when no plan has asked for more


class _Poison(PoolHook):
    """Fill freed blocks with ``POISON_BYTE`` in stream order (before any reuse of the block)."""

    def __init__(self, arena: HostArena):
        self.arena = arena

    def on_free(self, block: Block, stream: Stream | None) -> None:
        if stream is None:
            self.arena.fill(block.offset, block.size, POISON_BYTE)
        else:
            stream.launch(self.arena.fill, block.offset, block.size, POISON_BYTE)


class _Link:
    """One direction of the host-device link: one transfer at a time, optionally rate-limited."""

    def __init__(self, gbps: float | None):
        self.rate = None if gbps is None else gbps * 1e9
        self.lock = threading.Lock()
        self.bytes = 0  # total moved, for observation
        self.seconds = 0.0

    def copy(self, dst: np.ndarray, src: np.ndarray, staging: np.ndarray | None) -> None:
        start = time.perf_counter()
        with self.lock:
            if self.rate is None and staging is None:
                np.copyto(dst, src, casting="no")
            else:
                self._chunked(dst, src, staging)
            self.bytes += dst.nbytes
            self.seconds += time.perf_counter() - start

    def _chunked(self, dst: np.ndarray, src: np.ndarray, staging: np.ndarray | None) -> None:
        d = dst.reshape(-1).view(np.uint8)
        s = src.reshape(-1).view(np.uint8)
        n = d.size
        rate = self.rate
        start = time.perf_counter()
        for lo in range(0, n, _CHUNK):
            hi = min(lo + _CHUNK, n)
            if staging is None:
                d[lo:hi] = s[lo:hi]
            else:  # pageable: through the bounce buffer, as the CUDA driver does
                staging[: hi - lo] = s[lo:hi]
                d[lo:hi] = staging[: hi - lo]
            if rate is not None:
                delay = start + hi / rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)


class CpuDevice:
    """The CPU device (``vmem.device("cpu", memory="512MiB")``); see the module docstring.

    Parameters: ``memory`` is the capacity of device memory (bytes or a size string); ``pcie_gbps``
    throttles host-device copies to that many GB/s each way (None: as fast as memcpy); ``poison``
    NaN-fills freed blocks; ``pinned_memory`` is the capacity of the pinned host pool for offload,
    reserved when first used (default: twice ``memory``); ``alignment`` of device blocks in bytes;
    ``budget`` the :class:`~vmem.threads.CoreBudget` its steps run on (default: the process's).
    """

    kind = "cpu"
    holds_data = True
    conv_backend = HostConv()  # the host's convolutions (stateless: one for every CPU device)
    asynchronous = False  # work on a stream runs on its thread, timed by the host's clock
    graphs = False  # no CUDA graphs: every step is carried out as it is enqueued
    nchw_inputs = False  # the host makes a batch channels last (its streams read host memory anyway)

    def __init__(
        self,
        memory: int | str = "1GiB",
        *,
        pcie_gbps: float | None = None,
        poison: bool = False,
        pinned_memory: int | str | None = None,
        alignment: int = 256,
        budget: threads.CoreBudget | None = None,
        math: str = "exact",
    ):
        check_math("cpu", math, ("exact",))
        capacity = parse_bytes(memory, name="memory")
        if pcie_gbps is not None and not (isinstance(pcie_gbps, (int, float)) and pcie_gbps > 0):
            raise ValueError(f"pcie_gbps={pcie_gbps!r}: must be a positive number of GB/s, or None")
        self._pinned_capacity = (
            _DEFAULT_PINNED if pinned_memory is None else parse_bytes(pinned_memory, name="pinned_memory")
        )
        self.name = "cpu"
        self.xp = np
        #: the cores a step may keep busy (the process's budget unless one is given: BLAS's threads are the
        #: process's, so devices in one process share it by default)
        self.budget = threads.BUDGET if budget is None else budget
        #: the layers' pieces of work, side by side on this device's core budget
        self.ops = LaneOps(self.budget)
        self.poison = bool(poison)
        self.pool = DevicePool(capacity, alignment, HostArena, name="cpu device")
        self.spec = DeviceSpec(
            name="cpu", kind="cpu", memory=self.pool.capacity, pcie_gbps=None if pcie_gbps is None else float(pcie_gbps)
        )
        if self.poison:
            self.pool.add_hook(_Poison(self.pool.arena))
        self.compute_stream = CpuStream("compute")
        self.memory_stream = CpuStream("memory")
        self._d2h = _Link(self.spec.pcie_gbps)
        self._h2d = _Link(self.spec.pcie_gbps)
        self._pinned: PinnedHostPool | None = None
        self._pinned_fixed = pinned_memory is not None
        self._pinned_lock = threading.Lock()
        self._staging = {"d2h": np.empty(_CHUNK, np.uint8), "h2d": np.empty(_CHUNK, np.uint8)}
        self._closed = False
        threads.hold()  # the codec helpers' threads stop when the last device closes (or is dropped)
        self._release_threads = weakref.finalize(self, threads.release)

    def catalog(self, program: Program) -> Program:
        """``program`` whose convolutions offer the host's algorithms (:mod:`vmem.device.hostconv`), each op
        computed in float32 over low-precision storage (:mod:`vmem.device.staging`)."""
        return cpu_catalog(program)

    # -- memory ------------------------------------------------------------------------------------
    @property
    def pinned(self) -> PinnedHostPool:
        """The pinned host pool for offload, reserved (and prefaulted) in full on first use."""
        if self._pinned is None:
            with self._pinned_lock:
                if self._pinned is None:
                    self._pinned = PinnedHostPool(self._pinned_capacity, self.pool.alignment, name="cpu pinned")
        return self._pinned

    def view(self, block: Block, shape: ShapeLike, dtype: DTypeLike) -> np.ndarray:
        """A NumPy array over a device block."""
        return self.pool.view(block, shape, dtype)

    def host_view(self, block: Block, shape: ShapeLike, dtype: DTypeLike) -> np.ndarray:
        """A NumPy array over a pinned host block."""
        return self.pinned.view(block, shape, dtype)

    def is_pinned(self, array: np.ndarray) -> bool:
        """True if ``array`` lies in the pinned host pool."""
        if self._pinned is None:
            return False
        return _within(array, self._pinned.arena.buffer)

    def is_device(self, array: np.ndarray) -> bool:
        """True if ``array`` lies in device memory."""
        return _within(array, self.pool.arena.buffer)

    # -- copies ------------------------------------------------------------------------------------
    def copy_to_host(self, dst: np.ndarray, src: np.ndarray, stream: Stream | None = None) -> None:
        """Enqueue a device-to-host copy of ``src`` (a device view) into ``dst`` on ``stream``.

        ``stream`` defaults to the memory stream. If ``dst`` is not pinned the copy is staged and the host
        waits for it, as with pageable memory under CUDA.
        """
        self._copy(self._d2h, "d2h", dst, src, stream, host=dst, device=src)

    def copy_to_device(self, dst: np.ndarray, src: np.ndarray, stream: Stream | None = None) -> None:
        """Enqueue a host-to-device copy of ``src`` into ``dst`` (a device view) on ``stream``."""
        self._copy(self._h2d, "h2d", dst, src, stream, host=src, device=dst)

    def _copy(
        self,
        link: _Link,
        direction: str,
        dst: np.ndarray,
        src: np.ndarray,
        stream: Stream | None,
        *,
        host: np.ndarray,
        device: np.ndarray,
    ) -> None:
        if dst.shape != src.shape or dst.dtype != src.dtype:
            raise ValueError(
                f"{direction} copy: destination {dst.shape} {dst.dtype} does not match source {src.shape} {src.dtype}"
            )
        if not self.is_device(device):
            side = "source" if direction == "d2h" else "destination"
            raise ValueError(f"{direction} copy: the {side} is not a view of this device's memory")
        stream = self.memory_stream if stream is None else stream
        pageable = not self.is_pinned(host)
        if pageable and not (dst.flags.c_contiguous and src.flags.c_contiguous):
            raise ValueError(f"{direction} copy: a pageable host buffer must be C-contiguous")
        stream.launch(link.copy, dst, src, self._staging[direction] if pageable else None)
        if pageable:
            stream.record().synchronize()

    def copy_now(self, dst: np.ndarray, src: np.ndarray, direction: str) -> None:
        """Copy at once on the calling thread through the link (``"d2h"`` or ``"h2d"``): for work already
        running on a stream, which is how the executor times its offloads and prefetches."""
        link = self._d2h if direction == "d2h" else self._h2d
        link.copy(dst, src, None)

    def reserve_pinned(self, nbytes: int) -> PinnedHostPool:
        """Make sure the pinned pool holds at least ``nbytes``; call it before a step, never inside one.

        The pool is made (and prefaulted) on first use: ``nbytes``, or ``pinned_memory`` if that was given
        and is larger; an idle pool that is too small is replaced by a larger one. A busy one raises
        OutOfPinnedMemory. Buffers whose copies have completed are coalesced first, so that a step's exact
        fit finds the room the last step left, whatever order its buffers came back in."""
        with self._pinned_lock:
            pool = self._pinned
            if pool is not None and pool.capacity >= nbytes:
                pool.reclaim()  # the last step's returns, coalesced before this step's exact fit
                return pool
            if pool is not None:
                pool.require_idle(nbytes)
            self._pinned_capacity = max(nbytes, self._pinned_capacity if self._pinned_fixed else 0)
            self._pinned = PinnedHostPool(self._pinned_capacity, self.pool.alignment, name="cpu pinned")
            return self._pinned

    def readings(self) -> dict[str, Any]:
        """None on the CPU device (its memory is the pool's; see ``pool.stats()``)."""
        return {}

    def link_stats(self) -> dict[str, dict[str, float]]:
        """Bytes moved and seconds spent by the copy engine in each direction since the device was made."""
        return {
            d: {"bytes": link.bytes, "seconds": link.seconds} for d, link in (("d2h", self._d2h), ("h2d", self._h2d))
        }

    def new_stream(self, name: str) -> CpuStream:
        """Another worker-thread stream (its owner closes it)."""
        return CpuStream(name)

    # -- lifetime ----------------------------------------------------------------------------------
    def synchronize(self) -> None:
        """Wait for both streams; re-raise the first error their work raised."""
        errors = []
        for stream in (self.compute_stream, self.memory_stream):
            try:
                stream.synchronize()
            except BaseException as exc:  # keep syncing the other stream, then raise the first
                errors.append(exc)
        if errors:
            raise errors[0]

    def runs_codec(self, codec: Codec) -> bool:
        """Every codec runs on the CPU (its C kernels, or its NumPy reference)."""
        return True

    def device_array(self, x: object) -> None:
        """None: the CPU device's arrays are host arrays (a batch is taken as it is)."""
        return None

    def release_cached(self) -> None:
        """Nothing is cached outside the arena."""

    def step_scope(self) -> Any:
        """Cap BLAS's threads to the cores other processes leave free (the device's :attr:`budget`)."""
        return self.budget.limit()

    def dispatch_scope(self) -> Any:
        """The host enqueues a step with the streams' workers asleep: they wake when it is in, or when a
        thread waits for their progress (see :func:`vmem.streams.cpu.held`)."""
        return held(self.compute_stream, self.memory_stream)

    def capture(self) -> NoReturn:
        """Refused: only the CUDA device records steps as graphs."""
        raise DeviceError(f"{self.name}: CUDA graphs are the CUDA device's (graphs='on')")

    def close(self) -> None:
        """Finish outstanding work, stop the stream threads and, if no other device is open, the codec
        helpers' threads (idempotent)."""
        if self._closed:
            return
        self._closed = True
        first = None
        for stream in (self.compute_stream, self.memory_stream):
            try:
                stream.close()
            except BaseException as exc:
                first = first or exc
        self._release_threads()
        if first is not None:
            raise first

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "CpuDevice":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        link = "" if self.spec.pcie_gbps is None else f", pcie_gbps={self.spec.pcie_gbps:g}"
        return f"CpuDevice(memory={format_bytes(self.pool.capacity)}{link}{', poison' if self.poison else ''})"


def _within(array: np.ndarray, buffer: np.ndarray) -> bool:
    if array.base is buffer:  # views of a pool's arena (NumPy collapses view chains to the owner)
        return True
    lo = buffer.__array_interface__["data"][0]
    start = array.__array_interface__["data"][0]
    return lo <= start and start + array.nbytes <= lo + buffer.nbytes
