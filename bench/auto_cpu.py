"""``auto`` on the CPU device: its plan's predicted step time and peak against what the step measures.

For each model (default: the main job's ``digits_vgg`` at batch 32, and ``vgg_cifar`` at batch 64) at
``--fraction`` of the baseline policy's peak (default 0.5), a Trainer under ``auto`` profiles the device,
plans, and trains ``--steps`` timed steps (after one warm-up step) on a fixed batch. The plan's predicted
step time comes from that profile; the measured one is the median of the steps.

Targets (issue 33): |measured / predicted - 1| <= 0.10 for each model; the measured peak equals the
plan's (1 = equal).

    python bench/auto_cpu.py [--models digits_vgg:32,vgg_cifar:64] [--fraction 0.5] [--steps 10] [--json]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from _report import emit, table, verdict

import vmem
from vmem import format_bytes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="digits_vgg:32,vgg_cifar:64", help="model:batch, comma-separated")
    parser.add_argument("--fraction", type=float, default=0.5, help="budget as a fraction of baseline's peak")
    parser.add_argument("--steps", type=int, default=10, help="timed steps of each (default 10)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    rows, results, targets = [], {}, []
    for item in args.models.split(","):
        model, _, batch_text = item.partition(":")
        batch = int(batch_text or 32)
        net = vmem.models.get(model)
        peak = vmem.plan(net, batch, memory="64GiB", policy="baseline").peak_bytes
        budget = int(peak * args.fraction)
        rng = np.random.default_rng(0)
        x = rng.standard_normal((batch,) + tuple(net.input_shape)).astype(np.float32)
        y = rng.integers(0, net.output_shape()[-1], batch)
        with vmem.Trainer(net, memory=budget, policy="auto", seed=0) as trainer:
            trainer.step(x, y)  # plans (after profiling) and warms up
            reports = [trainer.step(x, y) for _ in range(args.steps)]
            plan = trainer.plans[batch]
        measured = float(np.median([r.seconds for r in reports]))
        spread = max(r.seconds for r in reports) / min(r.seconds for r in reports)
        predicted = plan.step_seconds
        peak_ratio = max(r.peak_bytes for r in reports) / plan.peak_bytes
        results[model] = {
            "batch": batch,
            "budget": budget,
            "baseline_peak": peak,
            "predicted_seconds": predicted,
            "measured_seconds": measured,
            "spread": spread,
            "peak_bytes": plan.peak_bytes,
            "measured_peak_ratio": peak_ratio,
            "chosen": plan.chosen,
            "reason": plan.reason,
        }
        rows.append(
            (
                f"{model}({batch})",
                format_bytes(budget),
                f"{predicted * 1e3:.1f}",
                f"{measured * 1e3:.1f}",
                f"{measured / predicted:.3f}",
                f"{spread:.2f}",
                f"{peak_ratio:.3f}",
                plan.chosen,
            )
        )
        targets.append(
            verdict(f"{model} auto: |measured / predicted step - 1|", abs(measured / predicted - 1), 0.10, at_least=False)
        )
        targets.append(verdict(f"{model} auto: measured peak / planned peak", peak_ratio, 1.0, at_least=False))
    print(f"auto on the CPU device at {args.fraction:g} of baseline's peak ({args.steps} timed steps, median):")
    print(
        table(
            ["model", "budget", "predicted ms", "measured ms", "measured/predicted", "max/min", "peak ratio", "start"],
            rows,
        )
    )
    return emit({"bench": "auto_cpu", "fraction": args.fraction, "results": results, "targets": targets}, args.json)


if __name__ == "__main__":
    sys.exit(main())
