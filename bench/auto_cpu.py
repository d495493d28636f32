"""``auto`` on the CPU device: its plan's predicted step time and peak against what the step measures.

For each model (default: the main job's ``digits_vgg`` at batch 32 in 0.5 of the baseline policy's peak,
and ``vgg_cifar`` at batch 128 in 0.6 of it), a Trainer under ``auto`` profiles the device,
plans, and trains ``--steps`` timed steps (after three warm-up steps) on a fixed batch. The plan's predicted
step time comes from that profile; the measured one is the median of the steps.

Targets (issue 33): |measured / predicted - 1| <= 0.10 for each model; the measured peak equals the
plan's (1 = equal).

    python bench/auto_cpu.py [--models digits_vgg:32:0.5,vgg_cifar:128:0.6] [--steps 30] [--json]
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
    parser.add_argument(
        "--models",
        default="digits_vgg:32:0.5,vgg_cifar:128:0.6",
        help="model:batch:fraction (the budget, of baseline's peak), comma-separated",
    )
    parser.add_argument("--steps", type=int, default=30, help="timed steps of each (default 30)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    rows, results, targets = [], {}, []
    for item in args.models.split(","):
        model, batch_text, fraction_text = (item.split(":") + ["32", "0.5"])[:3]
        batch, fraction = int(batch_text), float(fraction_text)
        net = vmem.models.get(model)
        peak = vmem.plan(net, batch, memory="64GiB", policy="baseline:algos=memory").peak_bytes
        budget = int(peak * fraction)
        rng = np.random.default_rng(0)
        x = rng.standard_normal((batch,) + tuple(net.input_shape)).astype(np.float32)
        y = rng.integers(0, net.output_shape()[-1], batch)
        with vmem.Trainer(net, memory=budget, policy="auto", seed=0) as trainer:
            for _ in range(3):  # plans (after profiling) and warms up
                trainer.step(x, y)
            reports = [trainer.step(x, y) for _ in range(args.steps)]
            plan = trainer.plans[batch]
        measured = float(np.median([r.seconds for r in reports]))
        spread = max(r.seconds for r in reports) / min(r.seconds for r in reports)
        predicted = plan.step_seconds
        peak_ratio = max(r.peak_bytes for r in reports) / plan.peak_bytes
        results[model] = {
            "batch": batch,
            "fraction": fraction,
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
                f"{format_bytes(budget)} ({fraction:g})",
                f"{predicted * 1e3:.1f}",
                f"{measured * 1e3:.1f}",
                f"{measured / predicted:.3f}",
                f"{spread:.2f}",
                f"{peak_ratio:.3f}",
                plan.chosen,
            )
        )
        targets.append(
            verdict(
                f"{model} auto: |measured / predicted step - 1|", abs(measured / predicted - 1), 0.10, at_least=False
            )
        )
        targets.append(verdict(f"{model} auto: measured peak / planned peak", peak_ratio, 1.0, at_least=False))
    print(f"auto on the CPU device, budgets a fraction of baseline's peak ({args.steps} timed steps, median):")
    print(
        table(
            ["model", "budget", "predicted ms", "measured ms", "measured/predicted", "max/min", "peak ratio", "start"],
            rows,
        )
    )
    return emit({"bench": "auto_cpu", "results": results, "targets": targets}, args.json)


if __name__ == "__main__":
    sys.exit(main())
