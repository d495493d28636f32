"""DeviceSpec: the facts about a device that planning needs. Plain data; imports nothing of the runtime,
so policies and cost models can read it without the pool or the streams."""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["DeviceSpec", "MATH_MODES", "check_math"]

#: How a device computes FP32 convolutions: ``"tf32"`` lets tensor cores round the inputs to TF32 (what
#: PyTorch allows for cuDNN's convolutions by default; matmuls stay exact), ``"exact"`` computes in FP32 with
#: fused multiply-adds (what tests comparing with the CPU device use). Half precision runs on tensor cores
#: either way.
MATH_MODES = ("tf32", "exact")


def check_math(device: str, math: str, allowed: tuple[str, ...] = MATH_MODES) -> str:
    """``math`` if it is one of ``allowed`` for ``device``, else ValueError naming both."""
    if math not in allowed:
        raise ValueError(
            f"{device}: math={math!r}; use "
            + " or ".join(repr(m) for m in allowed)
            + ("" if allowed == MATH_MODES else " (it computes in exact FP32 only)")
        )
    return math


@dataclass(frozen=True)
class DeviceSpec:
    """Facts about a device. ``memory`` in bytes; ``pcie_gbps`` is the host-device link rate in GB/s
    each way (None: not throttled, the CPU device's default). For GPUs (spec sheets in
    :mod:`vmem.device.specs`): ``fp32_tflops`` peak FP32 throughput, ``memory_gbps`` device memory
    bandwidth, ``h2d_gbps``/``d2h_gbps`` achieved pinned copy bandwidth each way, ``launch_us`` the cost of
    one kernel launch, and ``arch`` (the cost model's efficiency table). ``fp16_tflops`` and ``bf16_tflops``:
    peak dense tensor-core throughput in that precision with FP32 accumulation (None: the GPU has no such
    units, and computes half-precision convolutions at its FP32 rate, as cuDNN's pseudo-half does).
    ``math``: how FP32 convolutions compute (:data:`MATH_MODES`). ``interconnect`` (``"nvlink"``, ``"pcie"``, ``"ethernet"``; None: the host's shared memory, for processes
    of one machine) joins the devices of a data-parallel run: ``interconnect_gbps`` its achieved bandwidth
    per device each way (an all-reduce's bus bandwidth) and ``interconnect_us`` the latency of one step of
    a ring all-reduce."""

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
    fp16_tflops: float | None = None
    bf16_tflops: float | None = None
    interconnect: str | None = None
    interconnect_gbps: float | None = None
    interconnect_us: float | None = None
    #: how FP32 convolutions compute (see :data:`MATH_MODES`)
    math: str = "exact"

    def to_dict(self) -> dict:
        return asdict(self)
