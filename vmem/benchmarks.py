"""Microbenchmarks behind ``vmem bench``: host-device copy bandwidth, pinned against pageable, and the
effective bandwidth of transfers through a codec."""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any, Sequence, TYPE_CHECKING

import numpy as np

from .units import parse_bytes

if TYPE_CHECKING:
    from ._typing import Array
    from .codecs.base import Codec
    from .device.base import Device

__all__ = ["bandwidth", "codec_bandwidth", "relu_activations", "best_seconds", "typical_seconds", "DEFAULT_SIZES"]

DEFAULT_SIZES = ("64KiB", "256KiB", "1MiB", "4MiB", "16MiB", "64MiB", "256MiB")


def bandwidth(
    device: Device,
    sizes: Sequence[int | str] = DEFAULT_SIZES,
    *,
    rounds: int = 3,
    target_bytes: int = 256 << 20,
    progress: bool = False,
) -> list[dict[str, float]]:
    """Device-to-host and host-to-device GB/s per size, with pinned and with pageable host buffers.

    Copies are enqueued on the device's memory stream back to back (about ``target_bytes`` a round)
    and timed from the host across a synchronize; the best of ``rounds`` is kept. Pinned buffers come
    from the device's pinned pool; pageable ones are ordinary host arrays (staged and synchronous, as
    with cudaMemcpyAsync from pageable memory)."""
    nbytes = [parse_bytes(s, name="sizes") for s in sizes]
    biggest = max(nbytes)
    pinned_pool = device.reserve_pinned(biggest)
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
                for direction, copy, a, b in (
                    ("d2h", device.copy_to_host, host, dev),
                    ("h2d", device.copy_to_device, dev, host),
                ):
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
                print(f"  {n / 2**20:9.3f} MiB done", file=sys.stderr, flush=True)  # the table is stdout's
        finally:
            device.pool.free(block)
            pinned_pool.free(host_block)
    return rows


#: a call whose wall time exceeds the CPU time its process spent by this fraction lost time to others
_PREEMPTED = 0.1
_RESOLUTION = 20e-6  # seconds: the clocks' overhead on a short call


def best_seconds(
    fn: Any, rounds: int, *, warmup: bool = False, undisturbed: bool = False, most: int | None = None
) -> float:
    """The shortest of ``rounds`` timed calls of ``fn`` (after one untimed call if ``warmup``).

    ``undisturbed``: on a busy machine each of a few calls of some milliseconds may lose a time slice
    to another process, and their shortest then weighs the work two or three times over. With
    ``undisturbed``, calls go on past ``rounds``, up to ``most`` (default 4 x ``rounds``), until the
    shortest one ran undisturbed: this process's CPU time over the call (all its threads) covered its
    wall time. For work the host does itself (the CPU device), not for work it waits on."""
    limit = rounds if not undisturbed else max(rounds, most or 4 * rounds)
    if warmup:
        fn()
    best, clean = float("inf"), False
    for n in range(1, limit + 1):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if wall < best:
            best, clean = wall, wall <= cpu * (1 + _PREEMPTED) + _RESOLUTION
        if n >= rounds and (clean or not undisturbed):
            break
    return best


def typical_seconds(fn: Any, rounds: int, *, most: int | None = None) -> float:
    """The median of ``rounds`` undisturbed timed calls of ``fn`` (its CPU time over the call covered its
    wall time: no other process took the core), calling it up to ``most`` times (default 4 x ``rounds``)
    to see them; where fewer ran undisturbed, the median of the shortest ``rounds`` calls.

    What a call typically takes on this machine as it is, where :func:`best_seconds` gives the least: a
    step of many calls runs at their typical time, and on a shared machine (a virtual machine's
    neighbours, memory traffic, clock changes) that can be a tenth or more above their least even when
    nothing preempted them. For work the host does itself (the CPU device)."""
    limit = max(rounds, most or 4 * rounds)
    clean: list[float] = []
    every: list[float] = []
    for _ in range(limit):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        every.append(wall)
        if wall <= cpu * (1 + _PREEMPTED) + _RESOLUTION:
            clean.append(wall)
            if len(clean) >= rounds:
                break
    runs = clean if len(clean) >= rounds else sorted(every)[:rounds]
    return float(statistics.median(runs))


def relu_activations(n: int, density: float, seed: int = 0) -> np.ndarray:
    """``n`` float32 values like a ReLU output: half-normal magnitudes, a ``density`` fraction nonzero."""
    rng = np.random.default_rng(seed)
    x = np.abs(rng.standard_normal(n, dtype=np.float32))
    x[rng.random(n) >= density] = 0.0
    return x


def codec_bandwidth(
    device: Device,
    codec: Codec | str,
    sizes: Sequence[int | str] = ("4MiB", "16MiB", "64MiB"),
    densities: Sequence[float] = (0.1, 0.3, 0.5, 0.7, 0.9),
    *,
    rounds: int = 3,
    progress: bool = False,
) -> list[dict[str, float]]:
    """Effective offload and prefetch bandwidth through ``codec`` (uncompressed bytes per second, the
    encode or decode included) against the plain pinned copy of the same bytes, per size and density
    of ReLU-like activations. Everything runs on the memory stream, as the executor's offloads do."""
    from . import codecs
    from .codecs import transfer

    codec = codecs.get(codec)
    nbytes = [parse_bytes(s, name="sizes") for s in sizes]
    biggest = max(nbytes)
    pinned_pool = device.reserve_pinned(max(transfer.host_nbytes(codec, (biggest // 4,)), biggest) + 4096)
    ms = device.memory_stream
    rows = []

    def best(fn: Any) -> float:
        t = float("inf")
        for _ in range(rounds):
            t0 = time.perf_counter()
            ms.launch(fn)
            ms.synchronize()
            t = min(t, time.perf_counter() - t0)
        return t

    for n in nbytes:
        count = n // 4
        block = device.pool.allocate(count * 4, category="other")
        host_block = pinned_pool.allocate(max(transfer.host_nbytes(codec, (count,)), count * 4))
        try:
            dev = device.view(block, (count,), np.float32)
            host = device.host_view(host_block, (host_block.nbytes,), np.uint8)
            raw_d2h = best(lambda: device.copy_now(host[: count * 4], dev.view(np.uint8), "d2h"))
            raw_h2d = best(lambda: device.copy_now(dev.view(np.uint8), host[: count * 4], "h2d"))
            xp = device.xp

            def fill(v: Array) -> None:  # on the memory stream, in order with the transfers
                dev[...] = v

            for density in densities:
                box: dict[str, Any] = {}
                # made on the memory stream too: a pageable upload on another stream may still be landing
                ms.launch(lambda h=relu_activations(count, density): box.__setitem__("values", xp.asarray(h)))
                ms.synchronize()  # the CPU device's streams run their work on a thread of their own
                values = box["values"]
                ms.launch(fill, values)
                ms.synchronize()
                d2h = best(lambda: box.__setitem__("enc", transfer.send(device, codec, dev, host)))
                ms.launch(fill, 0)
                h2d = best(lambda: transfer.receive(device, codec, box["enc"], dev))
                if codec.lossless and not bool(xp.array_equal(dev.view(np.uint32), values.view(np.uint32))):
                    raise AssertionError(f"{codec.spec}: the round trip changed the data")
                rows.append(
                    {
                        "bytes": count * 4,
                        "density": density,
                        "encoded_bytes": box["enc"].nbytes,
                        "link_d2h_gbps": count * 4 / raw_d2h / 1e9,
                        "link_h2d_gbps": count * 4 / raw_h2d / 1e9,
                        "offload_gbps": count * 4 / d2h / 1e9,
                        "prefetch_gbps": count * 4 / h2d / 1e9,
                    }
                )
            if progress:
                print(f"  {n / 2**20:9.3f} MiB done", file=sys.stderr, flush=True)  # the table is stdout's
        finally:
            device.pool.free(block)
            pinned_pool.free(host_block)
    return rows
