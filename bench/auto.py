"""``auto`` against every named policy over a budget sweep on a simulated GPU, and MONeT's curve.

For each network and each budget (a fraction of its layer-wise peak, ``layerwise`` with its default
algorithms), every named lossless policy auto starts from (vdnn-all, vdnn-conv, vdnn-dyn, gist, echo,
mirror, chen, layerwise; with the fastest and the leanest algorithms; raw and through zero-value
compression) is planned on its own, then ``auto``. A cell is won when auto fits wherever a named policy
fits and its predicted step is no slower than the fastest fitting named one's.

MONeT's curve: ResNet-50 at batch 184 at 0.66, 0.40 and 0.33 of the layer-wise peak; auto's predicted step
against layer-wise allocation's with the fastest algorithms (MONeT, recomputation and operator choice
only: +3.2%, +9.3%, +12.0% at those fractions of its baseline); and ``auto:solver=ilp`` (descents whose
rounds SciPy's HiGHS solves) against the greedy search at those points.

Targets (issue 33): auto dominates in every cell; geometric mean over cells where something fits of
(fastest named / auto) >= 1.10; MONeT's points at <= +3%, +9%, +11%; the integer program and the fast
search within 5% of each other there; planning <= 10 s at every budget, NMT at sequence length 100 (8,600
ops) included (issue 62; issue 33 gave NMT 60 s).

    python bench/auto.py [--device sim:v100-16gb] [--fractions 0.3,0.5,0.7,0.9] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import math
import sys
import time

from _report import emit, table, verdict

import vmem
from vmem.errors import PlanError
from vmem.policies.auto import NAMED

NETWORKS = {  # name -> (model, options, batch)
    "vgg16": ("vgg16", {}, 64),
    "resnet50": ("resnet50", {}, 128),
    "googlenet": ("googlenet", {}, 128),
    "transformer": ("transformer", {}, 32),
    "nmt": ("nmt", {"seq_len": 100}, 128),
}
MONET = ((0.66, 0.03), (0.40, 0.09), (0.33, 0.11))


def named(net, batch: int, device: str, memory: int) -> dict[str, float | None]:
    """Each named policy's predicted step time where it fits (None where it does not)."""
    out: dict[str, float | None] = {}
    for spec in NAMED:
        try:
            r = vmem.plan(net, batch, device, spec, memory=memory, oversubscribe=True)
            out[spec] = r.step_seconds if r.fits else None
        except (PlanError, ValueError):
            out[spec] = None
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="sim:v100-16gb")
    parser.add_argument("--fractions", default="0.3,0.5,0.7,0.9")
    parser.add_argument("--networks", default=",".join(NETWORKS), help="comma-separated (default: all five)")
    parser.add_argument("--quick", action="store_true", help="skip MONeT's curve")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    fractions = [float(f) for f in args.fractions.split(",")]
    cells, rows, ratios, lost, slowest = [], [], [], 0, {}
    for name in args.networks.split(","):
        model, options, batch = NETWORKS[name]
        net = vmem.models.get(model, **options)
        ops = len(net.build(batch).ops)
        peak = vmem.plan(
            net, batch, args.device, "layerwise:algos=memory", memory="1TiB", oversubscribe=True
        ).peak_bytes
        for fraction in fractions:
            memory = int(peak * fraction)
            times = named(net, batch, args.device, memory)
            fit = {s: t for s, t in times.items() if t is not None}
            best = min(fit.items(), key=lambda kv: kv[1]) if fit else None
            t0 = time.perf_counter()
            try:
                result = vmem.plan(net, batch, args.device, "auto", memory=memory, oversubscribe=True)
                auto = result.step_seconds if result.fits else None
                chosen = result.plan.chosen
            except PlanError:
                auto, chosen = None, None
            seconds = time.perf_counter() - t0
            slowest[name] = max(slowest.get(name, 0.0), seconds)
            won = (best is None) or (auto is not None and auto <= best[1] * (1 + 1e-9))
            lost += not won
            if best is not None and auto is not None:
                ratios.append(best[1] / auto)
            cells.append(
                {
                    "network": name,
                    "ops": ops,
                    "batch": batch,
                    "fraction": fraction,
                    "memory": memory,
                    "named": times,
                    "best_named": best[0] if best else None,
                    "best_named_seconds": best[1] if best else None,
                    "auto_seconds": auto,
                    "auto_start": chosen,
                    "plan_seconds": seconds,
                    "won": won,
                }
            )
            rows.append(
                (
                    name,
                    fraction,
                    best[0] if best else "none fits",
                    f"{best[1] * 1e3:.1f}" if best else "-",
                    f"{auto * 1e3:.1f}" if auto is not None else "does not fit",
                    f"{best[1] / auto:.3f}" if best and auto else "-",
                    f"{seconds:.1f}",
                )
            )
            print(f"{name} at {fraction}: {rows[-1][2:]}", file=sys.stderr, flush=True)
    print(f"auto against the named policies on {args.device} (predicted step ms):")
    print(table(["network", "budget", "fastest named", "ms", "auto ms", "named/auto", "plan s"], rows))
    gmean = math.exp(sum(math.log(r) for r in ratios) / len(ratios)) if ratios else 1.0
    targets = [
        verdict("cells where auto loses to a named policy", float(lost), 0, at_least=False),
        verdict("geometric mean of fastest named / auto", gmean, 1.10),
    ]
    for name, seconds in slowest.items():
        targets.append(verdict(f"{name} auto planning seconds (worst budget)", seconds, 10.0, at_least=False))
    monet = []
    if not args.quick:
        net = vmem.models.get("resnet50")
        layer = vmem.plan(net, 184, args.device, "layerwise:algos=memory", memory="1TiB", oversubscribe=True)
        fast = vmem.plan(
            net, 184, args.device, "layerwise:algos=performance", memory="1TiB", oversubscribe=True
        ).step_seconds
        disagree = 0.0
        for fraction, limit in MONET:
            r = vmem.plan(net, 184, args.device, "auto", memory=int(layer.peak_bytes * fraction), oversubscribe=True)
            over = r.step_seconds / fast - 1 if r.fits else float("inf")
            t0 = time.perf_counter()
            ilp = vmem.plan(
                net, 184, args.device, "auto:solver=ilp", memory=int(layer.peak_bytes * fraction), oversubscribe=True
            )
            ilp_seconds = time.perf_counter() - t0
            ilp_over = ilp.step_seconds / fast - 1 if ilp.fits else float("inf")
            disagree = max(disagree, abs(ilp.step_seconds / r.step_seconds - 1))
            monet.append(
                {
                    "fraction": fraction,
                    "overhead": over,
                    "start": r.plan.chosen,
                    "ilp_overhead": ilp_over,
                    "ilp_start": ilp.plan.chosen,
                    "ilp_plan_seconds": ilp_seconds,
                }
            )
            print(
                f"MONeT point {fraction}: auto {over:+.2%} ({r.plan.chosen}); auto:solver=ilp {ilp_over:+.2%} "
                f"({ilp.plan.chosen}, {ilp_seconds:.1f} s)",
                file=sys.stderr,
                flush=True,
            )
            targets.append(verdict(f"MONeT point {fraction}: auto's step over layer-wise", over, limit, at_least=False))
        targets.append(verdict("MONeT points: |auto:solver=ilp / auto - 1|, the worst", disagree, 0.05, at_least=False))
    return emit(
        {"bench": "auto", "device": args.device, "cells": cells, "monet": monet, "geomean": gmean, "targets": targets},
        args.json,
    )


if __name__ == "__main__":
    sys.exit(main())
