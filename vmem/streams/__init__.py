"""Streams and events with CUDA semantics, for every device.

``Stream`` and ``Event`` are the protocols; :class:`CpuStream` and :class:`CpuEvent` implement them with
one worker thread per stream. The CUDA device wraps ``cupy.cuda.Stream``/``Event`` behind the same
protocol. :class:`VirtualStream` runs nothing and keeps a virtual clock: the simulated GPUs, the
planner's replay and the tests use it.
"""

from .base import Event, Stream, elapsed_time
from .cpu import THREAD_PREFIX, CpuEvent, CpuStream
from .virtual import HostClock, VirtualEvent, VirtualStream

__all__ = [
    "Stream",
    "Event",
    "elapsed_time",
    "CpuStream",
    "CpuEvent",
    "THREAD_PREFIX",
    "VirtualStream",
    "VirtualEvent",
    "HostClock",
]
