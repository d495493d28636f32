"""What a collective of several devices costs: a ring all-reduce over the interconnect of a device's spec.

A ring all-reduce of ``n`` bytes over ``N`` ranks moves ``2 (N - 1) / N * n`` bytes through each device's
link each way, in ``2 (N - 1)`` steps (a reduce-scatter, then an all-gather), each step paying the link's
latency: ``t = 2 (N - 1) / N * n / B + 2 (N - 1) * l``, with ``B`` the achieved bus bandwidth
(``DeviceSpec.interconnect_gbps``) and ``l`` the step latency (``interconnect_us``). Processes of one
machine without an interconnect in their spec (the CPU device) exchange through shared memory:
:data:`SHARED_MEMORY_GBPS` and :data:`SHARED_MEMORY_US`.
"""

from __future__ import annotations

from ..device.spec import DeviceSpec

__all__ = ["allreduce_seconds", "SHARED_MEMORY_GBPS", "SHARED_MEMORY_US"]

#: An all-reduce's bandwidth and step latency between processes of one machine (MPI over shared memory).
SHARED_MEMORY_GBPS = 5.0
SHARED_MEMORY_US = 20.0


def allreduce_seconds(spec: DeviceSpec, nbytes: int, ranks: int) -> float:
    """Seconds one all-reduce of ``nbytes`` takes over ``ranks`` devices of ``spec`` (0 for one rank)."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    gbps = spec.interconnect_gbps or SHARED_MEMORY_GBPS
    latency = (spec.interconnect_us if spec.interconnect_us is not None else SHARED_MEMORY_US) * 1e-6
    steps = 2 * (ranks - 1)
    return steps / ranks * nbytes / (gbps * 1e9) + steps * latency
