"""Microbenchmarks behind ``vmem bench``: host-device copy bandwidth, pinned against pageable."""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

from .units import parse_bytes

__all__ = ["bandwidth", "DEFAULT_SIZES"]

DEFAULT_SIZES = ("64KiB", "256KiB", "1MiB", "4MiB", "16MiB", "64MiB", "256MiB")


def bandwidth(device: Any, sizes: Sequence[int | str] = DEFAULT_SIZES, *, rounds: int = 3,
              target_bytes: int = 256 << 20, progress: bool = False) -> list[dict[str, float]]:
    """Device-to-host and host-to-device GB/s per size, with pinned and with pageable host buffers.

    Copies are enqueued on the device's memory stream back to back (about ``target_bytes`` a round)
    and timed from the host across a synchronize; the best of ``rounds`` is kept. Pinned buffers come
    from the device's pinned pool; pageable ones are ordinary host arrays (staged and synchronous, as
    with cudaMemcpyAsync from pageable memory)."""
    nbytes = [parse_bytes(s, name="sizes") for s in sizes]
    biggest = max(nbytes)
    pinned_pool = device.reserve_pinned(biggest) if hasattr(device, "reserve_pinned") else device.pinned
    rows = []
    for n in nbytes:
        block = device.pool.allocate(n, category="other")
        host_block = pinned_pool.allocate(n)
        try:
            dev = device.view(block, (n,), np.uint8)
            pinned = device.host_view(host_block, (n,), np.uint8)
            pageable = np.ones(n, np.uint8)
            dev[:] = 1
            reps = max(1, target_bytes // n)
            row: dict[str, float] = {"bytes": n}
            for label, host in (("pinned", pinned), ("pageable", pageable)):
                for direction, copy, a, b in (("d2h", device.copy_to_host, host, dev),
                                              ("h2d", device.copy_to_device, dev, host)):
                    best = 0.0
                    for _ in range(rounds):
                        t0 = time.perf_counter()
                        for _ in range(reps):
                            copy(a, b)
                        device.memory_stream.synchronize()
                        best = max(best, n * reps / (time.perf_counter() - t0) / 1e9)
                    row[f"{direction}_{label}_gbps"] = best
            rows.append(row)
            if progress:
                print(f"  {n / 2**20:9.3f} MiB done", flush=True)
        finally:
            device.pool.free(block)
            pinned_pool.free(host_block)
    return rows
