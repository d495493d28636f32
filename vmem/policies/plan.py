"""The Plan: what a policy decided for one network, batch and device. Decisions only; frozen plain data.

Decisions: the algorithm of every convolution pass, what happens to every stashed feature-map buffer
(named by the tensor that owns it: ``"keep"``, ``"offload"``, ``"encode"``, ``"recompute"``; a buffer no
backward reads may be kept or recomputed as the source of a rebuild), at which layer's backward each
offloaded buffer is prefetched, which codec encodes an offloaded buffer on its way to the host (cDMA) or
an encoded buffer on the device until backward (Gist), the offload sync mode, and how memory is
allocated (``"network"``: everything up front, as Torch and Caffe do; ``"layer"``: layer by layer,
released after last use).

What a plan costs (peak and average bytes, bytes offloaded, step time, stalls, per-layer rows) is not
part of it: :func:`vmem.plan` lowers the plan to a schedule and replays it, and returns the plan with
those figures (:class:`vmem.planner.PlanResult`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Plan"]


@dataclass(frozen=True)
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
    notes: dict[str, str] = field(default_factory=dict)  # buffer -> why the policy decided as it did (echo)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
