"""The CPU device's copy engine against a plain NumPy copy of the same sizes, in the same run.

Unthrottled, each size is copied device->pinned host on the memory stream (enqueued back to back, then
held until all are enqueued, then timed by timing events on that stream, as GPU copies are timed) and with ``numpy.copyto`` on the host
thread; the ratio is copy-engine GB/s over NumPy GB/s (best of several rounds, interleaved, to damp the noise of a shared machine). Throttled, a device
made with ``pcie_gbps=R`` must move data at R GB/s each way.

Targets (issue 2): ratio at least 0.8 for blocks of 4 MiB and more; throttled rate within 10% of R.

    python bench/copies.py [--sizes 64KiB,1MiB,...] [--rate 2] [--json]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

import numpy as np

from _report import emit, table, verdict

import vmem
from vmem import format_bytes, parse_bytes
from vmem.streams import elapsed_time

DEFAULT_SIZES = "64KiB,1MiB,4MiB,16MiB,64MiB,256MiB"


def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def measure(dev, nbytes: int, rounds: int, target_bytes: int) -> dict[str, float]:
    """Best-of-``rounds`` GB/s of NumPy and of the device's D2H and H2D copies of ``nbytes``."""
    block = dev.pool.allocate(nbytes, category="feature_maps")
    host_block = dev.pinned.allocate(nbytes)
    src = dev.view(block, (nbytes,), np.uint8)
    dst = dev.host_view(host_block, (nbytes,), np.uint8)
    src[:] = 1
    dst[:] = 2
    reps = max(1, target_bytes // nbytes)
    best = {"numpy": 0.0, "d2h": 0.0, "h2d": 0.0}
    mem = dev.memory_stream
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(reps):
            np.copyto(dst, src)
        best["numpy"] = max(best["numpy"], _gbps(nbytes * reps, time.perf_counter() - t0))
        for direction, copy, a, b in (("d2h", dev.copy_to_host, dst, src), ("h2d", dev.copy_to_device, src, dst)):
            # Timed on the stream, as GPU copies are: events before and after the batch. The stream is
            # held until everything is enqueued, so the host's enqueueing does not compete with it.
            gate = threading.Event()
            mem.launch(gate.wait)
            start = mem.record(timing=True)
            for _ in range(reps):
                copy(a, b)
            end = mem.record(timing=True)
            gate.set()
            end.synchronize()
            best[direction] = max(best[direction], _gbps(nbytes * reps, elapsed_time(start, end)))
    dev.pool.free(block)
    dev.pinned.free(host_block)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help=f"comma-separated sizes (default {DEFAULT_SIZES})")
    parser.add_argument("--rate", type=float, default=2.0, help="throttled link rate in GB/s (default 2)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per size (best is kept)")
    parser.add_argument("--json", action="store_true", help="also print the result as JSON")
    args = parser.parse_args(argv)
    sizes = [parse_bytes(s.strip(), name="--sizes") for s in args.sizes.split(",")]
    biggest = max(sizes)
    memory = 2 * biggest + (64 << 20)

    rows, unthrottled = [], []
    with vmem.device("cpu", memory=memory, pinned_memory=biggest + (1 << 20)) as dev:
        for n in sizes:
            r = measure(dev, n, args.rounds, target_bytes=512 << 20)
            ratio = min(r["d2h"], r["h2d"]) / r["numpy"]
            unthrottled.append({"bytes": n, **r, "ratio": ratio})
            rows.append((format_bytes(n), r["numpy"], r["d2h"], r["h2d"], ratio))
    print("copy engine vs numpy.copyto, unthrottled (GB/s, best of rounds)")
    print(table(["size", "numpy", "d2h", "h2d", "ratio"], rows))

    rows, throttled = [], []
    with vmem.device("cpu", memory=memory, pcie_gbps=args.rate, pinned_memory=biggest + (1 << 20)) as dev:
        for n in [s for s in sizes if s >= 4 << 20]:
            r = measure(dev, n, 1, target_bytes=int(args.rate * 1e9 * 0.25))
            err = max(abs(r["d2h"] - args.rate), abs(r["h2d"] - args.rate)) / args.rate
            throttled.append({"bytes": n, "d2h": r["d2h"], "h2d": r["h2d"], "error": err})
            rows.append((format_bytes(n), r["d2h"], r["h2d"], f"{err:.1%}"))
    print(f"\nthrottled to pcie_gbps={args.rate:g} (GB/s achieved)")
    print(table(["size", "d2h", "h2d", "error"], rows))

    big = [u["ratio"] for u in unthrottled if u["bytes"] >= 4 << 20]
    targets = []
    if big:
        targets.append(verdict("min copy-engine/numpy ratio, blocks >= 4 MiB", min(big), 0.8))
    if throttled:
        targets.append(verdict("max throttled rate error", max(t["error"] for t in throttled), 0.10, at_least=False))
    return emit(
        {
            "bench": "copy",
            "unthrottled": unthrottled,
            "throttled": throttled,
            "rate_gbps": args.rate,
            "targets": targets,
        },
        args.json,
    )


if __name__ == "__main__":
    sys.exit(main())
