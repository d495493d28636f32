"""The Plan: what a policy decided for one network, batch and device, and the figures it predicts.

Plain data that serializes to JSON. Decisions (set by the policy): the algorithm of every convolution
pass, what happens to every stashed feature-map buffer (named by the tensor that owns it), at which
layer's backward each offloaded buffer is prefetched, which codec encodes an offloaded buffer on its way
to the host (``"offload"`` with a codec: cDMA) or an encoded buffer on the device until backward
(``"encode"``: Gist), the offload sync mode, and how memory is allocated
(``"network"``: everything up front, as Torch and Caffe do; ``"layer"``: layer by layer, released after
last use). Figures (filled in by
:func:`vmem.plan`, which replays the allocations through the device's pool code): peak and time-weighted
average bytes, bytes per category, bytes offloaded, predicted step time, and whether it fits.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


__all__ = ["Plan"]


@dataclass
class Plan:
    policy: str
    network: str
    batch: int
    device: str
    capacity: int
    allocation: str  # "network" | "layer"
    algos: dict[str, dict[str, str]] = field(default_factory=dict)  # op -> pass -> algorithm
    stash: dict[str, str] = field(default_factory=dict)  # stashed buffer (owner) -> "keep" | "offload" | "encode"
    codecs: dict[str, str] = field(default_factory=dict)  # offloaded or encoded buffer -> codec spec
    density: float = 0.5  # expected fraction of nonzeros, to size data-dependent encodings when planning
    # fixed-point buffers whose per-channel range comes from a batch norm: buffer -> {"batchnorm": op name,
    # "relu": whether a ReLU follows it, "sigmas": half-width in standard deviations} (see policies.ranges)
    ranges: dict[str, dict[str, Any]] = field(default_factory=dict)
    prefetch: dict[str, list[str]] = field(default_factory=dict)  # op -> buffers to prefetch at its backward
    sync: str | None = None  # "layer" | "event" for offloading plans
    reason: str = ""
    chosen: str | None = None  # for a policy that chooses among others (vdnn-dyn): the one it chose
    step: int | None = None  # ... and the step of its procedure that chose it
    # figures
    peak_bytes: int = 0
    average_bytes: float = 0.0
    offloaded_bytes: int = 0
    step_seconds: float | None = None
    stall_seconds: float | None = None
    update_seconds: float | None = None  # the optimizer's share of step_seconds
    baseline_step_seconds: float | None = None
    by_category: dict[str, dict[str, float]] = field(default_factory=dict)
    fits: bool = True
    layers: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def table(self) -> str:
        """A per-layer table: output shape, algorithms, stash decision, bytes (see vmem.report)."""
        from ..report import layer_table

        return layer_table(self)
