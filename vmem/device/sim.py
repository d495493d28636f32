"""Simulated GPUs: a spec sheet and a pool over a virtual arena, for planning. No data, no kernels.

``vmem.device("sim:titan-x")`` gives a device whose pool does the same offset arithmetic as any other
(so peaks include alignment and fragmentation exactly) but has no backing memory; ``vmem.plan`` on it
replays a step's allocations through that pool and predicts time with the roofline cost model
(:mod:`vmem.costs`) on virtual compute and memory clocks. A Trainer refuses it: there is nothing to
train on.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..errors import DeviceError
from ..pool import DevicePool
from ..units import format_bytes, parse_bytes
from . import specs
from .base import DeviceSpec

__all__ = ["SimDevice"]


class _Event:
    timing = False

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: Any) -> float:
        raise DeviceError("a simulated device has no clock; plans predict time instead")


class _Stream:
    """A stream with nothing to run: events complete at once."""

    def __init__(self, name: str):
        self.name = name

    def launch(self, fn: Any, *args: Any, **kwargs: Any) -> None:
        raise DeviceError(f"simulated stream {self.name!r}: a simulated device runs no work")

    def record(self, event: Any = None, *, timing: bool = False) -> _Event:
        return _Event()

    def wait(self, event: Any) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def close(self) -> None:
        pass


class SimDevice:
    """A simulated GPU (``sim:<name>``); ``memory=`` overrides the spec sheet's capacity."""

    kind = "sim"
    xp = None

    def __init__(self, gpu: str | DeviceSpec, *, memory: int | str | None = None, alignment: int = 256):
        spec = gpu if isinstance(gpu, DeviceSpec) else specs.get(gpu)
        if memory is not None:
            spec = replace(spec, memory=parse_bytes(memory, name="memory"))
        self.spec = spec
        self.name = f"sim:{spec.name}"
        self.pool = DevicePool(spec.memory, alignment, None, name=self.name)
        self.compute_stream = _Stream("compute")
        self.memory_stream = _Stream("memory")

    @property
    def pinned(self) -> Any:
        raise DeviceError(f"{self.name} is simulated: it has no pinned host memory")

    def view(self, block: Any, shape: Any, dtype: Any) -> Any:
        raise DeviceError(f"{self.name} is simulated and holds no data; plan on it with vmem.plan")

    host_view = view

    def copy_to_host(self, dst: Any, src: Any, stream: Any = None) -> None:
        raise DeviceError(f"{self.name} is simulated: nothing to copy")

    copy_to_device = copy_to_host

    def synchronize(self) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> "SimDevice":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def __repr__(self) -> str:
        s = self.spec
        return (f"SimDevice({s.name}: {format_bytes(s.memory)}, {s.fp32_tflops:g} TFLOP/s FP32, "
                f"{s.memory_gbps:g} GB/s, host link {s.h2d_gbps:g} GB/s)")
