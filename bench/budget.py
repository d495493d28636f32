"""Memory budgets on the CPU device: where the baseline fails and vdnn-all still trains.

For vgg_cifar (batch 256 by default), with memory-optimal algorithms: the baseline's peak; the smallest
device capacity at which vdnn-all fits (a binary search over capacities, each checked by replaying the
step's allocations through the pool at that capacity, so alignment and fragmentation count), then
verified by training real steps on a CPU device of exactly that capacity; and a budget between the two
at which the baseline raises OutOfDeviceMemory while vdnn-all trains.

Target (issue 4): the smallest vdnn-all budget is at most 0.6x the baseline's peak.

    python bench/budget.py [--batch 256] [--steps 2] [--json]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from _report import emit, table, verdict

import vmem
from vmem import format_bytes
from vmem.errors import OutOfDeviceMemory


def smallest_budget(net, batch: int, policy: str) -> int:
    """Least capacity, in whole MiB, at which the plan fits (replayed through the pool at that capacity).

    Fitting is not quite monotonic in the capacity (best fit places blocks differently in a different
    arena), so the binary search's answer is checked and, if need be, stepped up until it fits."""
    mib = 1 << 20
    hi = -(-vmem.plan(net, batch, memory=1 << 40, policy=policy).peak_bytes // mib)
    lo = hi // 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if vmem.plan(net, batch, memory=mid * mib, policy=policy).fits:
            hi = mid
        else:
            lo = mid
    while not vmem.plan(net, batch, memory=hi * mib, policy=policy).fits:
        hi += 1
    return hi * mib


def trains(net_fn, batch: int, policy: str, memory: int, steps: int) -> tuple[bool, int]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)
    y = rng.integers(0, 10, batch)
    try:
        with vmem.Trainer(net_fn(), memory=memory, policy=policy, seed=0) as trainer:
            peak = max(trainer.step(x, y).peak_bytes for _ in range(steps))
        return True, peak
    except OutOfDeviceMemory:
        return False, 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=2, help="real training steps for each check")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    def make():
        return vmem.models.get("vgg_cifar")

    net = make()
    base_peak = vmem.plan(net, args.batch, memory=1 << 40, policy="baseline:algos=memory").peak_bytes
    vdnn_budget = smallest_budget(net, args.batch, "vdnn-all:algos=memory")
    between = (base_peak + vdnn_budget) // 2
    rows, checks = [], {}
    for label, policy, memory in [
        ("baseline at its own peak", "baseline:algos=memory", base_peak),
        ("baseline at the middle budget", "baseline:algos=memory", between),
        ("vdnn-all at the middle budget", "vdnn-all:algos=memory", between),
        ("vdnn-all at its smallest budget", "vdnn-all:algos=memory", vdnn_budget),
    ]:
        ok, peak = trains(make, args.batch, policy, memory, args.steps)
        checks[label] = {"policy": policy, "memory": memory, "trains": ok, "peak_bytes": peak}
        rows.append(
            (label, format_bytes(memory), "trains" if ok else "OutOfDeviceMemory", format_bytes(peak) if ok else "-")
        )
    print(
        f"vgg_cifar batch {args.batch}, memory-optimal algorithms: baseline peak {format_bytes(base_peak)}, "
        f"smallest vdnn-all budget {format_bytes(vdnn_budget)}"
    )
    print(table(["check", "device memory", "result", "measured peak"], rows))
    ratio = vdnn_budget / base_peak
    targets = [verdict("smallest vdnn-all budget / baseline peak", ratio, 0.6, at_least=False)]
    consistent = (
        checks["baseline at its own peak"]["trains"]
        and not checks["baseline at the middle budget"]["trains"]
        and checks["vdnn-all at the middle budget"]["trains"]
        and checks["vdnn-all at its smallest budget"]["trains"]
    )
    print(
        f"checks: baseline fails and vdnn-all trains at the middle budget, vdnn-all trains at its smallest: "
        f"{'yes' if consistent else 'NO'}"
    )
    return emit(
        {
            "bench": "budget",
            "batch": args.batch,
            "baseline_peak_bytes": base_peak,
            "vdnn_all_budget_bytes": vdnn_budget,
            "ratio": ratio,
            "checks": checks,
            "consistent": consistent,
            "targets": targets,
        },
        args.json,
    )


if __name__ == "__main__":
    sys.exit(main())
