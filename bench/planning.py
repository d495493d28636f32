"""Planning speed and packing quality.

Times ``vmem.plan`` under vdnn-dyn on a simulated Titan X for the two largest schedules the issues name,
resnet_cifar(depth=1001) and VGG-416 at batch 32 (best and worst of ``--rounds``), and compares the peaks
of the old packing (the packer before the sweeps: greedy by size, by lifetime and in allocation order,
each with the lowest and the tightest gap; O(n^2)) with the new one (``"auto"``: first- and best-fit time
sweeps, plus the greedy orders on schedules of up to ``GREEDY_LIMIT`` blocks) on every zoo model, for
three policies.

Targets (issue 11): vdnn-dyn plans resnet_cifar(1001) in under 5 s and VGG-416 in under 2 s; the new
packing's peaks are the same or tighter on the zoo.

    python bench/planning.py [--rounds 3] [--batch 32] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import sys
import time

from _report import emit, table, verdict

import dataclasses

import vmem
from vmem import format_bytes, policies
from vmem.device.sim import SimDevice
from vmem.planning import Target
from vmem.schedule.lower import lower
from vmem.schedule.pack import GREEDY_LIMIT, _greedy, lifetimes, place
from vmem.schedule.replay import replay

BIG = {
    "resnet_cifar(1001)": lambda: vmem.models.get("resnet_cifar", depth=1001),
    "vgg416": lambda: vmem.models.get("vgg416"),
}
POLICIES = ("baseline:algos=performance", "vdnn-all", "gist")


def plan_seconds(make, batch: int, rounds: int) -> tuple[float, float, int]:
    times, peak = [], 0
    for _ in range(rounds):
        net = make()  # a fresh network: nothing cached
        t0 = time.perf_counter()
        peak = vmem.plan(net, batch, "sim:titan-x", "vdnn-dyn").peak_bytes
        times.append(time.perf_counter() - t0)
    return min(times), max(times), peak


OLD_ORDERS = (
    lambda il: (-il[1].size, -(il[1].end - il[1].start), il[1].start),  # the packer before the sweeps
    lambda il: (-(il[1].end - il[1].start), -il[1].size, il[1].start),
    lambda il: (il[1].start, -il[1].size),
)


def old_place(schedule) -> None:
    """Place the schedule's blocks as vmem did before the sweeps: the best of six greedy packings."""
    from vmem.schedule.steps import Alloc

    base = sum(-(-b.nbytes // 256) * 256 for b in schedule.persistent)
    lives = lifetimes(schedule.steps, schedule.alignment)
    _, offsets = min((_greedy(lives, base, o, t) for o in OLD_ORDERS for t in (False, True)), key=lambda c: c[0])
    k = 0
    for i, st in enumerate(schedule.steps):
        if type(st) is Alloc:
            schedule.steps[i] = dataclasses.replace(st, offset=offsets[k])
            k += 1


def peaks(net, batch: int, policy: str) -> tuple[int, int, int]:
    """(blocks, peak with the old packing, peak with the new)."""
    spec = dataclasses.replace(vmem.device("sim:titan-x").spec, memory=1 << 50)
    target = Target(spec)
    program, costs = target.view(net.build(batch)), target.costs()
    decided = policies.get(policy).decide(program, spec, costs, None)
    schedule = lower(program, decided)
    out = [len(lifetimes(schedule.steps, schedule.alignment))]
    for placer in (old_place, place):
        placer(schedule)
        out.append(replay(schedule, SimDevice(spec)).peak_bytes)
    return tuple(out)  # type: ignore[return-value]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--quick", action="store_true", help="compare packings on the zoo only (not the two big)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result: dict = {"timings": {}, "peaks": [], "verdicts": []}
    rows = []
    for name, make in BIG.items():
        lo, hi, peak = plan_seconds(make, args.batch, args.rounds)
        result["timings"][name] = {"min": lo, "max": hi, "peak_bytes": peak}
        rows.append((name, f"{lo:.2f}", f"{hi:.2f}", format_bytes(peak)))
    print(f"vmem.plan under vdnn-dyn on sim:titan-x, batch {args.batch}, {args.rounds} rounds")
    print(table(("model", "min s", "max s", "peak"), rows))
    result["verdicts"].append(
        verdict(
            "resnet_cifar(1001) vdnn-dyn plan seconds (worst round)",
            result["timings"]["resnet_cifar(1001)"]["max"],
            5.0,
            at_least=False,
        )
    )
    result["verdicts"].append(
        verdict("vgg416 vdnn-dyn plan seconds (worst round)", result["timings"]["vgg416"]["max"], 2.0, at_least=False)
    )
    nets = {n: (lambda n=n: vmem.models.get(n)) for n in vmem.models.names()}
    if not args.quick:
        nets.update(BIG)
    rows, worse = [], 0
    for name, make in nets.items():
        for policy in POLICIES:
            blocks, old, new = peaks(make(), args.batch, policy)
            worse += new > old
            result["peaks"].append({"model": name, "policy": policy, "blocks": blocks, "old": old, "new": new})
            rows.append((name, policy, blocks, format_bytes(old), format_bytes(new), f"{new / old:.4f}"))
    print(
        f"\npeaks at batch {args.batch} on sim:titan-x, old packing (six greedy packings) vs new (sweeps, plus "
        f"the greedy orders up to {GREEDY_LIMIT} blocks)"
    )
    print(table(("model", "policy", "blocks", "old peak", "new peak", "new / old"), rows))
    result["verdicts"].append(
        verdict("models x policies where the new packing's peak is higher", worse, 0, at_least=False)
    )
    return emit(result, args.json)


if __name__ == "__main__":
    sys.exit(main())
