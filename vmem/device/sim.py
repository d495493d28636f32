"""Simulated GPUs: a spec sheet, a pool over a virtual arena and virtual streams, for planning. No data.

``vmem.device("sim:titan-x")`` gives a device whose pool does the same offset arithmetic as any other
(so peaks include alignment and fragmentation exactly) but has no backing memory, and whose streams are
:class:`~vmem.streams.VirtualStream` s with clocks: ``vmem.plan`` replays a step's schedule through this
pool and on these clocks (:mod:`vmem.schedule.replay`), predicting time with a cost model. A Trainer
refuses it: there is nothing to train on.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Any, TYPE_CHECKING, NoReturn

import numpy as np

from ..errors import DeviceError
from ..pool import DevicePool
from ..streams import HostClock, VirtualStream
from ..units import format_bytes, parse_bytes
from . import specs
from .spec import DeviceSpec, check_math

if TYPE_CHECKING:
    from .._typing import Array, ShapeLike
    from ..pool._bestfit import Block
    from ..codecs.base import Codec
    from numpy.typing import DTypeLike
    from ..graph.program import Program
    from ..streams.base import Stream

__all__ = ["SimDevice"]


class SimDevice:
    """A simulated GPU (``sim:<name>``, or any :class:`DeviceSpec`); ``memory=`` overrides the capacity."""

    kind = "sim"
    xp = np  # shapes and dtypes only: it holds no data
    holds_data = False
    conv_backend = None
    ops = None  # holds no data: runs no layer
    asynchronous = False
    graphs = False
    nchw_inputs = False

    def __init__(
        self, gpu: str | DeviceSpec, *, memory: int | str | None = None, alignment: int = 256, math: str | None = None
    ):
        spec = gpu if isinstance(gpu, DeviceSpec) else specs.get(gpu)
        if memory is not None:
            spec = replace(spec, memory=parse_bytes(memory, name="memory"))
        if math is not None:  # recorded in its plans (the roofline prices FP32 alike either way)
            spec = replace(spec, math=check_math(f"sim:{spec.name}", math))
        self.spec = spec
        self.name = f"sim:{spec.name}" if spec.kind == "sim" else spec.name
        self.pool = DevicePool(spec.memory, alignment, None, name=self.name)
        host = HostClock()  # the host's waits hold back both streams' later work
        self.compute_stream = VirtualStream("compute", host=host)
        self.memory_stream = VirtualStream("memory", host=host)
        self._closed = False

    def catalog(self, program: Program) -> Program:
        """``program`` with cuDNN's algorithms as the simulator models them for this GPU's architecture."""
        from .cudnn_catalog import with_cudnn_catalog

        return with_cudnn_catalog(program, self.spec.arch)

    def runs_codec(self, codec: Codec) -> bool:
        """A simulated GPU plans the codecs a GPU runs."""
        return bool(codec.gpu)

    def device_array(self, x: object) -> None:
        """None: a simulated GPU holds no data."""
        return None

    def release_cached(self) -> None:
        """Nothing is cached: a simulated GPU holds no data."""

    def _no_data(self, what: str) -> DeviceError:
        return DeviceError(f"{self.name} is simulated and holds no data ({what}); plan on it with vmem.plan")

    @property
    def pinned(self) -> None:
        """None: a simulated device has no host memory (:meth:`reserve_pinned` says so)."""
        return None

    def reserve_pinned(self, nbytes: int) -> Any:
        raise DeviceError(f"{self.name} is simulated: it has no pinned host memory")

    def view(self, block: Block, shape: ShapeLike, dtype: DTypeLike) -> Array:
        raise self._no_data("view")

    def host_view(self, block: Block, shape: ShapeLike, dtype: DTypeLike) -> Array:
        raise self._no_data("host_view")

    def copy_to_host(self, dst: Array, src: Array, stream: Stream | None = None) -> None:
        raise self._no_data("copy_to_host")

    def copy_to_device(self, dst: Array, src: Array, stream: Stream | None = None) -> None:
        raise self._no_data("copy_to_device")

    def copy_now(self, dst: Array, src: Array, direction: str) -> None:
        raise self._no_data("copy_now")

    def readings(self) -> dict[str, Any]:
        return {}

    def link_stats(self) -> dict[str, dict[str, float]]:
        return {d: {"bytes": 0, "seconds": 0.0} for d in ("d2h", "h2d")}

    def new_stream(self, name: str) -> VirtualStream:
        """Another virtual stream on the device's clock."""
        return VirtualStream(name, host=self.compute_stream.host)

    def synchronize(self) -> None:
        for stream in (self.compute_stream, self.memory_stream):
            stream.synchronize()

    def step_scope(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def dispatch_scope(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def capture(self) -> NoReturn:
        """Refused: only the CUDA device records steps as graphs."""
        raise DeviceError(f"{self.name}: CUDA graphs are the CUDA device's (graphs='on')")

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True

    def __enter__(self) -> "SimDevice":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        s = self.spec
        if s.fp32_tflops is None:
            return f"SimDevice({s.name}: {format_bytes(s.memory)})"
        return (
            f"SimDevice({s.name}: {format_bytes(s.memory)}, {s.fp32_tflops:g} TFLOP/s FP32, "
            f"{s.memory_gbps:g} GB/s, host link {s.h2d_gbps:g} GB/s)"
        )
