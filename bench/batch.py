"""The batch beyond one layer's working set (issue 51): how large a batch trains in a budget, and in how little
memory a batch trains.

Simulated H100 (``sim:h100-sxm``), VGG-16 at 224x224, 8 GiB: the largest whole batch each policy plans to fit
(bisection on the exact plan: ``vmem.largest_batch``), FP32 and bf16, and auto's plan of batch 512 (as
micro-batches where the whole batch does not fit). Auto's floor keeps the ReLUs' signs as bits, prefetches
each map at its reader and splits each convolution's backward (filter, then data), so a layer holds two maps
where it held three; the sign bits a split would hold beside dy + dx wait on the host (``signs=host``).

CPU device, vgg_cifar at batch 256: the smallest budget auto plans to fit without micro-batches (its floor,
replayed through the pool at each capacity) and with them, as fractions of the baseline's planned peak; then
two real steps at each budget under ``auto`` (profiled), against two baseline steps: the measured peak within
the budget and equal to the plan's, the losses equal within 1e-4 relative.

CPU device, resnet_cifar (batch norm after every convolution) at batch 64 in half the least memory auto
trains it in whole: micro-batches whose batch norms keep the whole batch's statistics (statistics passes
before each step), against the baseline's loss (within 1e-4) and auto's whole-batch step time (reported).

Targets: FP32 largest batch under auto:microbatch=off >= 259 (2.8x PyTorch plain's 92 measured on an H100);
batch 512 plans to fit under auto; bf16 >= 2x the FP32 figure; each plan within 60 s; CPU budgets <= 0.37
(no micro-batches) and <= 0.20 (auto) of the baseline's planned peak.

    python bench/batch.py [--quick] [--json]      (--quick: the simulator's part only)
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from _report import emit, table, verdict

import vmem
from vmem import format_bytes
from vmem.planning import Target, largest_batch, plan_program, smallest_memory
from vmem.planning.microbatch import plan_microbatched, sums_passes
from vmem.policies import auto

FLOOR = f"{auto.LEANEST},split=on"  # auto's leanest plan, split as auto runs it


def simulated(device: str = "sim:h100-sxm", memory: str = "8GiB") -> dict:
    net = vmem.models.get("vgg16")
    rows, out = [], {}
    for name, policy, precision in (
        ("vdnn-all (the paper)", "vdnn-all:algos=memory", "fp32"),
        ("auto, whole batch", "auto:microbatch=off", "fp32"),
        ("auto, whole batch, bf16", "auto:microbatch=off", "bf16"),
    ):
        t0 = time.perf_counter()
        batch = largest_batch(net, device, memory=memory, policy=policy, precision=precision)
        seconds = time.perf_counter() - t0
        out[name] = {"policy": policy, "precision": precision, "largest_batch": batch, "seconds": seconds}
        rows.append((name, precision, batch, f"{seconds:.1f}"))
    t0 = time.perf_counter()
    micro = vmem.plan(net, 512, device, "auto", memory=memory)
    seconds = time.perf_counter() - t0
    out["auto at 512"] = {
        "fits": bool(micro.fits),
        "microbatches": micro.plan.microbatch,
        "peak_bytes": micro.peak_bytes,
        "step_seconds": micro.step_seconds,
        "seconds": seconds,
    }
    rows.append(
        ("auto at batch 512", "fp32", f"fits: {micro.fits} ({micro.plan.microbatch} micro-batches)", f"{seconds:.1f}")
    )
    print(f"VGG-16 at 224x224 on {device}, {memory}:")
    print(table(["plan", "precision", "largest batch", "planning s"], rows))
    return out


def _batches(batch: int, steps: int) -> list:
    rng = np.random.default_rng(0)
    return [
        (rng.standard_normal((batch, 3, 32, 32)).astype(np.float32), rng.integers(0, 10, batch)) for _ in range(steps)
    ]


def _train(make, data: list, batch: int, policy: str, memory: int) -> dict:
    """Steps of ``make()`` on the CPU device under ``policy`` in ``memory``: what the plan and the steps say."""
    with vmem.Trainer(make(), device="cpu", memory=memory, policy=policy, seed=0) as tr:
        reports = [tr.step(x, y) for x, y in data]
        plan = tr.plans[batch]
    return {
        "policy": policy,
        "memory": memory,
        "microbatches": plan.microbatch,
        "planned_peak": plan.peak_bytes,
        "measured_peaks": [r.peak_bytes for r in reports],
        "losses": [r.loss for r in reports],
        "step_seconds": [r.seconds for r in reports],
        "reason": plan.reason,
    }


def cpu(batch: int = 256, steps: int = 2) -> dict:
    net = vmem.models.get("vgg_cifar")
    target = Target.of("cpu")
    program = net.build(batch)
    base, _ = plan_program(program, target.with_memory(1 << 40), "baseline")
    peak = base.peak_bytes
    whole = smallest_memory(program, target, "auto")  # auto's floor, without micro-batches

    def micro_fits(memory: int) -> bool:
        found = plan_microbatched(lambda n: net.build(n), batch, target.with_memory(memory), FLOOR + ",microbatch=on")
        return found is not None

    lo, hi = 1 << 20, whole  # the least capacity at which micro-batches of the floor fit, to 64 KiB
    while hi - lo > 1 << 16:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if micro_fits(mid) else (mid, hi)
    micro = hi
    data = _batches(batch, steps)

    def train(policy: str, memory: int) -> dict:
        return _train(lambda: vmem.models.get("vgg_cifar"), data, batch, policy, memory)

    reference = train("baseline", int(peak * 1.25))
    runs = {"auto:microbatch=off": train("auto:microbatch=off", whole), "auto": train("auto", micro)}
    rows = []
    for run in runs.values():
        run["within_budget"] = all(p <= run["memory"] for p in run["measured_peaks"])
        run["as_planned"] = all(p == run["planned_peak"] for p in run["measured_peaks"])
        run["loss_rel_diff"] = max(abs(a - b) / abs(b) for a, b in zip(run["losses"], reference["losses"]))
        rows.append(
            (
                run["policy"],
                format_bytes(run["memory"]),
                f"{run['memory'] / peak:.3f}",
                run["microbatches"],
                run["within_budget"] and run["as_planned"],
                f"{run['loss_rel_diff']:.1e}",
            )
        )
    print(f"\nvgg_cifar at batch {batch} on the CPU device (baseline's planned peak {format_bytes(peak)}):")
    print(
        table(["policy", "budget", "of baseline", "micro-batches", "peak as planned, within", "loss vs baseline"], rows)
    )
    return {"baseline_peak_bytes": peak, "baseline_losses": reference["losses"], "runs": runs}


def batch_norm(batch: int = 64, steps: int = 2, depth: int = 8) -> dict:
    """resnet_cifar (batch norm after every convolution) on the CPU device in half the least memory auto
    trains it in whole: as micro-batches with statistics passes, against the baseline's loss and auto's
    whole-batch step time."""
    net = vmem.models.get("resnet_cifar", depth=depth)
    target = Target.of("cpu")
    whole = smallest_memory(net.build(batch), target, "auto")
    data = _batches(batch, steps)

    def train(policy: str, memory: int) -> dict:
        return _train(lambda: vmem.models.get("resnet_cifar", depth=depth), data, batch, policy, memory)

    reference = train("baseline", 1 << 32)
    runs = {"auto, whole": train("auto:microbatch=off", whole), "auto, half of that": train("auto", whole // 2)}
    split = runs["auto, half of that"]
    passes = len(sums_passes(net.build(-(-batch // split["microbatches"]))))
    rows = []
    for name, run in runs.items():
        run["as_planned"] = all(p == run["planned_peak"] <= run["memory"] for p in run["measured_peaks"])
        run["loss_rel_diff"] = max(abs(a - b) / abs(b) for a, b in zip(run["losses"], reference["losses"]))
        rows.append(
            (
                name,
                format_bytes(run["memory"]),
                run["microbatches"],
                run["as_planned"],
                f"{run['loss_rel_diff']:.1e}",
                f"{min(run['step_seconds']):.2f}",
            )
        )
    print(
        f"\nresnet_cifar (depth {depth}) at batch {batch} on the CPU device, batch norm over micro-batches "
        f"({passes} statistics passes a step):"
    )
    print(table(["plan", "budget", "micro-batches", "peak as planned, within", "loss vs baseline", "step s"], rows))
    slower = min(split["step_seconds"]) / min(runs["auto, whole"]["step_seconds"])
    print(f"as micro-batches a step takes {slower:.1f}x auto's whole-batch step (its statistics passes included)")
    return {"runs": runs, "statistics_passes": passes, "slower": slower, "baseline_losses": reference["losses"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the simulator's part only")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    sim = simulated()
    fp32 = sim["auto, whole batch"]["largest_batch"]
    bf16 = sim["auto, whole batch, bf16"]["largest_batch"]
    targets = [
        verdict("VGG-16 largest FP32 batch, auto:microbatch=off", fp32, 259),
        verdict("VGG-16 batch 512 fits under auto (1 = yes)", float(sim["auto at 512"]["fits"]), 1),
        verdict("VGG-16 bf16 largest batch / FP32's", bf16 / fp32, 2.0),
        verdict("longest planning (s)", max(v["seconds"] for v in sim.values()), 60, at_least=False, unit=" s"),
    ]
    result = {"bench": "batch", "simulated": sim}
    if not args.quick:
        result["cpu"] = c = cpu()
        peak = c["baseline_peak_bytes"]
        for policy, want in (("auto:microbatch=off", 0.37), ("auto", 0.20)):
            run = c["runs"][policy]
            targets.append(
                verdict(f"vgg_cifar b256 budget / baseline peak, {policy}", run["memory"] / peak, want, at_least=False)
            )
            targets.append(
                verdict(
                    f"{policy}: steps within the budget, peak as planned (1 = yes)",
                    float(run["within_budget"] and run["as_planned"]),
                    1,
                )
            )
            targets.append(
                verdict(f"{policy}: loss vs baseline (relative)", run["loss_rel_diff"], 1e-4, at_least=False)
            )
        result["batch_norm"] = bn = batch_norm()
        run = bn["runs"]["auto, half of that"]
        targets.append(
            verdict("batch norm as micro-batches: peak as planned, within (1 = yes)", float(run["as_planned"]), 1)
        )
        targets.append(
            verdict("batch norm as micro-batches: loss vs baseline", run["loss_rel_diff"], 1e-4, at_least=False)
        )
    result["targets"] = targets
    return emit(result, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
