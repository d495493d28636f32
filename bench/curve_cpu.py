"""The memory/time curve on the CPU device, measured: every point's plan trained, its measured peak and step
time against the planned (``vmem plan --curve --measure``, :func:`vmem.training.curve.measured_curve`).

For each network (default ``digits_vgg`` at batch 32 and ``vgg_cifar`` at batch 128) the curve is planned from
a Trainer's fresh profile of this machine (none kept from an earlier run) (auto at 20 budgets or more from its floor to keep-all, the named policies
at their least memory), then each point's plan is trained for ``--steps`` timed steps after two warm-up steps
(the median step is its measured time). This machine's speed drifts over a minute and other processes share
its two cores: the figures are one pass over the points, the spread of measured / predicted is printed.

Targets (issue 62): every point's measured peak equals its planned peak; at least 8 points per network whose
measured step is within 10% of the predicted.

    python bench/curve_cpu.py [--models digits_vgg:32,vgg_cifar:128] [--steps 8] [--json]
"""

from __future__ import annotations

import argparse
import sys

from _report import emit, machine, verdict

import vmem
from vmem.training.curve import measured_curve

#: the least number of points per network measured within 10% of their prediction
WITHIN = 8


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="digits_vgg:32,vgg_cifar:128", help="model:batch, comma-separated")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per point (default 8)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    results, targets = {}, []
    for item in args.models.split(","):
        model, batch = item.split(":")
        net = vmem.models.get(model)
        made = measured_curve(
            net, int(batch), "cpu", steps=args.steps, profile_cache=False, progress=lambda t: print(" ", t, flush=True)
        )
        print(made.table())
        every = (*made.points, *made.named)
        ratios = [p.measured_seconds / p.step_seconds for p in every if p.measured_seconds is not None]
        within = sum(abs(r - 1) <= 0.10 for r in ratios)
        peaks_equal = all(p.measured_peak == p.memory for p in every)
        replanned = sum(p.replanned is not None for p in every)
        results[model] = {
            "batch": int(batch),
            "points": len(every),
            "within_10_percent": within,
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "peaks_equal": peaks_equal,
            "replanned": replanned,
            "curve": made.to_dict(),
        }
        print(
            f"{model}: {within} of {len(every)} points within 10% of the predicted step "
            f"(measured / predicted {min(ratios):.3f} to {max(ratios):.3f}); measured peak = planned peak at "
            f"{'every' if peaks_equal else 'not every'} point; {replanned} run as another plan"
        )
        targets.append(verdict(f"{model}: points whose measured step is within 10% of the predicted", within, WITHIN))
        targets.append(
            verdict(
                f"{model}: points whose measured peak is the planned peak, of all",
                float(sum(p.measured_peak == p.memory for p in every)) / len(every),
                1.0,
            )
        )
    return emit({"bench": "curve_cpu", "machine": machine(), "results": results, "targets": targets}, args.json)


if __name__ == "__main__":
    sys.exit(main())
