"""How long each piece of a step takes: a roofline for simulated GPUs, measurements for the CPU device.

A cost model answers ``op_seconds(op, pass_, algo)`` (``pass_`` is ``"forward"``, ``"backward_data"``,
``"backward_filter"`` for convolutions and ``"forward"``/``"backward"`` for the rest),
``copy_seconds(nbytes, direction)``, ``update_seconds(param_bytes)`` and ``host_overheads()``, and says by
``codec_offload`` whether offloading through a codec can save time (true where it does not say). The planner replays a schedule
against it on two virtual clocks (compute and memory streams) to predict step time, stalls and the
time-weighted average memory.

The roofline takes the larger of compute time (effective FLOPs over peak times the algorithm's
efficiency, scaled down for layers too small to fill the GPU) and memory time (bytes over bandwidth),
plus a launch overhead. Its constants are calibrated so that the convnet-benchmarks models land near
their published Titan X times (bench/reproduce_vdnn.py prints the comparison).
"""

from __future__ import annotations

from typing import Protocol

from ..graph import OpInfo

__all__ = ["CostModel"]


class CostModel(Protocol):
    def op_seconds(self, op: OpInfo, pass_: str, algo: str | None) -> float: ...

    def copy_seconds(self, nbytes: int, direction: str) -> float: ...

    def update_seconds(self, param_bytes: int) -> float: ...

    def host_overheads(self) -> tuple[float, float]:
        """What the host adds to a step beyond its work: (seconds to enqueue one schedule step, where the
        streams start only once the step is enqueued; seconds a stream spends on one item besides its
        work). (0, 0) where the device runs while the host enqueues (a GPU)."""
        ...

    def misc_seconds(self, kind: str, nbytes: int) -> float:
        """The loss (``"loss"``), adding a gradient contribution of ``nbytes`` (``"acc"``), or encoding or
        decoding a feature map (``"encode"``, ``"decode"``; ``nbytes``: the map's bytes plus its encoding's,
        what the kernel reads and writes)."""
        ...
