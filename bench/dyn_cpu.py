"""vdnn-dyn on the CPU device against every static policy that fits the same memory budget.

vgg_cifar at batch 128 (default), with a device budget at which the baseline with the fastest
algorithms does not fit (``--fraction`` of its peak, default 0.55). vdnn-dyn profiles, plans and chooses;
each static policy (baseline, vdnn-conv, vdnn-all, each memory- and performance-optimal) that fits the
budget trains too. Steps are interleaved across trainers, each round starting one trainer later, and the
medians compared.

Target (issue 5): vdnn-dyn fits and is no slower than any static policy that fits (ratio to the fastest
fitting static policy at most 1.0, up to measurement noise: reported as measured).

    python bench/dyn_cpu.py [--batch 128] [--fraction 0.55] [--steps 8] [--json]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from _report import emit, table, verdict

import vmem
from vmem import format_bytes

STATIC = [
    "baseline:algos=memory",
    "baseline:algos=performance",
    "vdnn-conv:algos=memory",
    "vdnn-conv:algos=performance",
    "vdnn-all:algos=memory",
    "vdnn-all:algos=performance",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="vgg_cifar")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--fraction", type=float, default=0.55, help="budget as a fraction of baseline's peak")
    parser.add_argument("--steps", type=int, default=8, help="timed steps of each (default 8)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    net = vmem.models.get(args.model)
    peak = vmem.plan(net, args.batch, memory="64GiB", policy="baseline:algos=performance").peak_bytes
    budget = int(peak * args.fraction)
    fitting = [p for p in STATIC if vmem.plan(net, args.batch, memory=budget, policy=p).fits]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch,) + net.input_shape).astype(np.float32)
    y = rng.integers(0, 10, args.batch)
    trainers = {}
    try:
        for policy in ["vdnn-dyn"] + fitting:
            trainers[policy] = vmem.Trainer(
                vmem.models.get(args.model),
                memory=budget,
                policy=policy,
                seed=0,
                optimizer=vmem.optim.SGD(lr=0.01, momentum=0.9),
            )
            trainers[policy].step(x, y)
        times: dict[str, list[float]] = {p: [] for p in trainers}
        order = list(trainers)
        for i in range(args.steps):  # interleaved, each round starting one trainer later: no fixed position
            for p in order[i % len(order) :] + order[: i % len(order)]:
                times[p].append(trainers[p].step(x, y).seconds)
        dyn_plan = trainers["vdnn-dyn"].plans[args.batch]
        peaks = {p: t.plans[args.batch].peak_bytes for p, t in trainers.items()}
    finally:
        for t in trainers.values():
            t.close()
    median = {p: float(np.median(v)) for p, v in times.items()}
    print(
        f"{args.model} batch {args.batch} in {format_bytes(budget)} ({args.fraction:g} of baseline's peak "
        f"{format_bytes(peak)}); vdnn-dyn chose {dyn_plan.chosen} at step {dyn_plan.step}"
    )
    print(f"  {dyn_plan.reason}")
    print(
        table(
            ["policy", "step s", "peak", "fits"],
            [(p, median[p], format_bytes(peaks[p]), "yes") for p in trainers]
            + [(p, "-", "-", "no") for p in STATIC if p not in fitting],
        )
    )
    fastest_static = min((median[p] for p in fitting), default=float("nan"))
    targets = [
        verdict("vdnn-dyn / fastest fitting static policy", median["vdnn-dyn"] / fastest_static, 1.0, at_least=False)
    ]
    return emit(
        {
            "bench": "dyn_cpu",
            "model": args.model,
            "batch": args.batch,
            "budget": budget,
            "baseline_peak": peak,
            "chosen": dyn_plan.chosen,
            "step": dyn_plan.step,
            "reason": dyn_plan.reason,
            "seconds": median,
            "fitting": fitting,
            "targets": targets,
        },
        args.json,
    )


if __name__ == "__main__":
    sys.exit(main())
