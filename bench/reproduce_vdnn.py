"""vDNN's evaluation on a simulated Titan X (12 GB), from plans alone (no training).

First the calibration: predicted forward+backward time per iteration of the convnet-benchmarks models
under ``baseline`` with the fastest algorithms, against the published Titan X (cuDNN v4) figures.
Then, for AlexNet, OverFeat, GoogLeNet and VGG-16 at batches 64, 128 and 256, and VGG-116/216/316/416
at batch 32: peak, time-weighted average and offloaded memory, and step time relative to ``baseline``
with the fastest algorithms (an oracle where it does not fit), for baseline, vdnn-all and vdnn-conv
(each memory- and performance-optimal) and vdnn-dyn. Configurations that do not fit in 12 GB are marked.

Targets (issue 5): each calibration model within 25% of its published time; the table in under 60 s.

    python bench/reproduce_vdnn.py [--device sim:titan-x] [--json]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
sys.path[:] = [p for p in sys.path if str(Path(p or ".").resolve()) != _HERE] + [_HERE]
from _report import emit, table, verdict  # noqa: E402

import vmem  # noqa: E402
from vmem.errors import PlanError  # noqa: E402

PUBLISHED = {"alexnet": (128, 0.081), "overfeat": (128, 0.268), "vgg_a": (64, 0.529), "googlenet": (128, 0.470)}
CONFIGS = ([(m, b) for m in ("alexnet", "overfeat", "googlenet", "vgg16") for b in (64, 128, 256)]
           + [(f"vgg{d}", 32) for d in (116, 216, 316, 416)])
POLICIES = ["baseline:algos=memory", "baseline:algos=performance", "vdnn-all:algos=memory",
            "vdnn-all:algos=performance", "vdnn-conv:algos=memory", "vdnn-conv:algos=performance", "vdnn-dyn"]
GiB = 2**30


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="sim:titan-x")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()

    rows, calibration, targets = [], {}, []
    for name, (batch, published) in PUBLISHED.items():
        plan = vmem.plan(vmem.models.get(name), batch, args.device, "baseline:algos=performance", memory="1000GB")
        predicted = plan.step_seconds - plan.update_seconds  # convnet-benchmarks times forward + backward
        calibration[name] = {"batch": batch, "predicted": predicted, "published": published}
        rows.append((name, batch, predicted * 1e3, published * 1e3, predicted / published))
    print(f"calibration on {args.device}: baseline (fastest algorithms), forward+backward per iteration")
    print(table(["model", "batch", "predicted ms", "published ms", "ratio"], rows))
    for name, c in calibration.items():
        targets.append(verdict(f"{name} predicted/published", abs(c["predicted"] / c["published"] - 1), 0.25,
                               at_least=False))

    results = []
    rows = []
    for model, batch in CONFIGS:
        net = vmem.models.get(model)
        for policy in POLICIES:
            try:
                plan = vmem.plan(net, batch, args.device, policy)
            except PlanError:
                results.append({"model": model, "batch": batch, "policy": policy, "fits": False, "error": "PlanError"})
                rows.append((model, batch, policy, "-", "-", "-", "-", "NO (PlanError)"))
                continue
            rel = plan.step_seconds / plan.baseline_step_seconds
            label = policy if plan.chosen is None else f"vdnn-dyn -> {plan.chosen.split(',sync')[0]} (step {plan.step})"
            results.append({"model": model, "batch": batch, "policy": policy, "chosen": plan.chosen, "step": plan.step,
                            "fits": plan.fits, "peak_bytes": plan.peak_bytes, "average_bytes": plan.average_bytes,
                            "offloaded_bytes": plan.offloaded_bytes, "step_seconds": plan.step_seconds,
                            "relative_to_baseline": rel})
            rows.append((model, batch, label, plan.peak_bytes / GiB, plan.average_bytes / GiB,
                         plan.offloaded_bytes / GiB, rel, "yes" if plan.fits else "NO"))
    seconds = time.perf_counter() - t0
    print(f"\n{args.device}: GiB; time relative to baseline with the fastest algorithms (oracle if it does not fit)")
    print(table(["model", "batch", "policy", "peak", "average", "offloaded", "time x", "fits"], rows))
    print(f"\n{len(results)} plans in {seconds:.1f} s")
    targets.append(verdict("seconds for the whole table", seconds, 60, at_least=False))
    return emit({"bench": "reproduce_vdnn", "device": args.device, "calibration": calibration, "results": results,
                 "seconds": seconds, "targets": targets}, args.json)


if __name__ == "__main__":
    sys.exit(main())
