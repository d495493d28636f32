"""The Device protocol: what the runtime needs from a CPU, simulated or CUDA device."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable

from ..pool import Block, DevicePool, PinnedHostPool
from ..streams import Stream

__all__ = ["Device", "DeviceSpec"]


@dataclass(frozen=True)
class DeviceSpec:
    """Facts about a device. ``memory`` in bytes; ``pcie_gbps`` is the host-device link rate in GB/s
    each way (None: not throttled, the CPU device's default). For GPUs (spec sheets in
    :mod:`vmem.device.specs`): ``fp32_tflops`` peak FP32 throughput, ``memory_gbps`` device memory
    bandwidth, ``h2d_gbps``/``d2h_gbps`` achieved pinned copy bandwidth each way, ``launch_us`` the cost of
    one kernel launch, and ``arch`` (the cost model's efficiency table)."""

    name: str
    kind: str
    memory: int
    pcie_gbps: float | None = None
    fp32_tflops: float | None = None
    memory_gbps: float | None = None
    h2d_gbps: float | None = None
    d2h_gbps: float | None = None
    launch_us: float | None = None
    arch: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@runtime_checkable
class Device(Protocol):
    """A device: a pool over its memory, a pinned host pool, a compute and a memory stream.

    Arrays on the device are views of pool blocks (``view``); host buffers for offload are views of
    pinned blocks (``host_view``). ``copy_to_host``/``copy_to_device`` enqueue a copy on a stream
    (the memory stream by default) and return at once.
    """

    name: str
    spec: DeviceSpec
    xp: Any
    pool: DevicePool
    compute_stream: Stream
    memory_stream: Stream

    @property
    def pinned(self) -> PinnedHostPool: ...

    def view(self, block: Block, shape: Any, dtype: Any) -> Any: ...

    def host_view(self, block: Block, shape: Any, dtype: Any) -> Any: ...

    def copy_to_host(self, dst: Any, src: Any, stream: Stream | None = None) -> None: ...

    def copy_to_device(self, dst: Any, src: Any, stream: Stream | None = None) -> None: ...

    def synchronize(self) -> None: ...

    def close(self) -> None: ...
