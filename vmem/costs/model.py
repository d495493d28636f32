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

from typing import Any, Protocol

from ..graph import OpInfo

__all__ = ["CostModel", "host_costs"]


def host_costs(parts: Any) -> tuple[float, float, float]:
    """A cost model's ``host_overheads()`` as three floats (a model may give the first two alone)."""
    values = [float(v) for v in parts]
    if len(values) not in (2, 3):
        raise ValueError(f"host overheads: {len(values)} figures; want (per step, per item[, per copy])")
    return values[0], values[1], values[2] if len(values) == 3 else 0.0


class CostModel(Protocol):
    def op_seconds(self, op: OpInfo, pass_: str, algo: str | None) -> float: ...

    def copy_seconds(self, nbytes: int, direction: str) -> float: ...

    def update_seconds(self, param_bytes: int) -> float: ...

    def host_overheads(self) -> tuple[float, float, float]:
        """What the host adds to a step beyond its work: (seconds to enqueue one schedule step, where the
        streams start only once the step is enqueued; seconds a stream spends on one item besides its
        work; seconds the compute stream loses to each copy the memory stream runs, where the streams
        share the host's cores and interpreter). Zeros where the device runs while the host enqueues (a
        GPU). A model may give the first two alone."""
        ...

    def misc_seconds(self, kind: str, nbytes: int) -> float:
        """The loss (``"loss"``), adding a gradient contribution of ``nbytes`` (``"acc"``), or encoding or
        decoding a feature map (``"encode"``, ``"decode"``; ``nbytes``: the map's bytes plus its encoding's,
        what the kernel reads and writes)."""
        ...


class AtBatch:
    """``costs``, a cost model measured for a network at one batch, read for the same network at ``ratio``
    times that batch (a micro-batch: :mod:`vmem.planning.microbatch`): each op's and the loss's time scaled
    by the ratio (to first order a layer's work is linear in its batch), copies, gradient additions,
    encodings (by their bytes), the update and the host's overheads as they are."""

    def __init__(self, costs: CostModel, ratio: float):
        self.costs, self.ratio = costs, float(ratio)

    def op_seconds(self, op: OpInfo, pass_: str, algo: str | None) -> float:
        return self.costs.op_seconds(op, pass_, algo) * self.ratio

    def copy_seconds(self, nbytes: int, direction: str) -> float:
        return self.costs.copy_seconds(nbytes, direction)

    def update_seconds(self, param_bytes: int) -> float:
        return self.costs.update_seconds(param_bytes)

    def host_overheads(self) -> tuple[float, float, float]:
        return host_costs(self.costs.host_overheads())

    def misc_seconds(self, kind: str, nbytes: int) -> float:
        seconds = self.costs.misc_seconds(kind, nbytes)
        return seconds * self.ratio if kind == "loss" else seconds
