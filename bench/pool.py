"""Allocator throughput on a realistic trace: the block sizes and order of a training step.

The trace is that of vgg_cifar (conv 3x3 channels 64,64,M,128,128,M,256,256,M,512,512,M, FC 2048-10)
at batch 64 in float32, allocated layer by layer as vDNN does: each layer's output and workspace in the
forward pass, each gradient map and workspace in the backward pass, feature maps released after their
last use. Weights are allocated once, outside the timed loop. It reports allocate+free pairs per second
with host-ordered frees and with stream-ordered frees (an event recorded at each free).

Target (issue 2): at least 100,000 pairs per second.

    python bench/pool.py [--steps N] [--json]
"""

from __future__ import annotations

import argparse
import sys
import time

from _report import emit, table, verdict

from vmem.pool import DevicePool
from vmem.streams import CpuStream

CONFIG = [64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M"]


def layer_bytes(batch: int = 64) -> list[tuple[int, int]]:
    """(output bytes, workspace bytes) per layer of vgg_cifar at ``batch`` (workspace: im2col)."""
    layers = []
    c, hw = 3, 32
    for item in CONFIG:
        if item == "M":
            hw //= 2
            layers.append((batch * c * hw * hw * 4, 0))
        else:
            layers.append((batch * item * hw * hw * 4, batch * c * 9 * hw * hw * 4))  # conv
            c = item
            layers.append((batch * c * hw * hw * 4, 0))  # relu (separate output in this trace)
    layers.append((batch * 10 * 4, 0))  # fc
    return layers


def trace(batch: int = 64) -> list[tuple]:
    """A list of ("alloc", key, nbytes, category) and ("free", key) for one step."""
    ops: list[tuple] = []
    sizes = layer_bytes(batch)
    ops.append(("alloc", "x0", batch * 3 * 32 * 32 * 4, "feature_maps"))
    for i, (out, ws) in enumerate(sizes):
        ops.append(("alloc", f"y{i}", out, "feature_maps"))
        if ws:
            ops.append(("alloc", f"ws{i}", ws, "workspace"))
            ops.append(("free", f"ws{i}"))
    ops.append(("alloc", f"dy{len(sizes) - 1}", sizes[-1][0], "gradient_maps"))
    for i in range(len(sizes) - 1, -1, -1):
        in_bytes = sizes[i - 1][0] if i else batch * 3 * 32 * 32 * 4
        if i:
            ops.append(("alloc", f"dx{i}", in_bytes, "gradient_maps"))
        if sizes[i][1]:
            ops.append(("alloc", f"wsb{i}", sizes[i][1], "workspace"))
            ops.append(("free", f"wsb{i}"))
        ops.append(("free", f"dy{i}"))
        ops.append(("free", f"y{i}"))
        if i:
            ops.append(("rename", f"dx{i}", f"dy{i - 1}"))
    ops.append(("free", "x0"))
    return ops


def replay(pool: DevicePool, ops: list[tuple], steps: int, stream) -> tuple[int, float]:
    live: dict[str, object] = {}
    allocate, free = pool.allocate, pool.free
    pairs = 0
    t0 = time.perf_counter()
    for _ in range(steps):
        for op in ops:
            kind = op[0]
            if kind == "alloc":
                live[op[1]] = allocate(op[2], stream, op[3])
                pairs += 1
            elif kind == "free":
                free(live.pop(op[1]), stream)
            else:
                live[op[2]] = live.pop(op[1])
    seconds = time.perf_counter() - t0
    assert not live and pool.in_use == pool.stats().by_category["weights"].in_use
    return pairs, seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000, help="training steps replayed per variant")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--json", action="store_true", help="also print the result as JSON")
    args = parser.parse_args(argv)

    ops = trace(args.batch)
    rows, results = [], {}
    stream = CpuStream("bench")
    try:
        for name, s in (("host-ordered", None), ("stream-ordered", stream)):
            pool = DevicePool("4GiB")
            pool.allocate(4 * 2**20, category="weights")
            replay(pool, ops, 20, s)  # warm up
            pairs, seconds = replay(pool, ops, args.steps, s)
            rate = pairs / seconds
            results[name] = {"pairs": pairs, "seconds": seconds, "pairs_per_second": rate, "peak_bytes": pool.peak}
            rows.append((name, pairs, seconds, rate, pool.peak / 2**20))
    finally:
        stream.close()
    print(f"allocator replay: vgg_cifar batch {args.batch}, {sum(o[0] == 'alloc' for o in ops)} allocations per step")
    print(table(["frees", "pairs", "seconds", "pairs/s", "peak MiB"], rows))
    targets = [
        verdict("stream-ordered allocate+free pairs per second", results["stream-ordered"]["pairs_per_second"], 100_000)
    ]
    return emit(
        {"bench": "pool", "batch": args.batch, "steps": args.steps, "results": results, "targets": targets}, args.json
    )


if __name__ == "__main__":
    sys.exit(main())
