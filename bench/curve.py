"""The memory/time curve (issue 62): ``vmem.curve`` of each network on a simulated GPU, timed, and what placement
costs in ``auto``'s plans (the packed peak over the most bytes live at once).

For each network: the whole curve (auto from its floor to keep-all, denser where the time changes, the named
policies at their least memory) with the seconds it took, the points it kept and whether it is monotone;
then auto's plan at half of its keep-all peak and its packing (peak / live bytes), or why there is none.

Targets: each curve monotone (memory rising, time falling); each curve within 60 s on 2 cores (its budgets
planned in two processes, ``--workers``; the same curve as one process plans); every packing <= 1.02.

    python bench/curve.py [--device sim:h100-sxm] [--networks vgg16,resnet50,...] [--quick] [--workers 2] [--json]
"""

from __future__ import annotations

import argparse
import sys
import time

import auto
from _report import emit, table, verdict

import vmem
from vmem.errors import PlanError

NETWORKS = dict(auto.NETWORKS)  # name -> (model, options, batch): the networks auto's bench sweeps
#: a BERT-base encoder: 12 blocks of 768 wide, 12 heads, a 3072 feed-forward, BERT's vocabulary, 128 tokens
NETWORKS["bert_base"] = (
    "transformer",
    {"layers": 12, "dim": 768, "heads": 12, "ffn": 3072, "vocab": 30522, "seq_len": 128},
    32,
)
QUICK = {"vgg_cifar": ("vgg_cifar", {}, 128), "resnet_cifar": ("resnet_cifar", {}, 128)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="sim:h100-sxm")
    parser.add_argument("--networks", help="comma-separated, of: " + ", ".join([*NETWORKS, *QUICK]))
    parser.add_argument("--quick", action="store_true", help="the small networks only (seconds, not minutes)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    parser.add_argument(
        "--workers", type=int, default=2, help="processes planning a curve's budgets (default 2: the target's 2 cores)"
    )
    args = parser.parse_args(argv)
    every = {**NETWORKS, **QUICK}
    names = args.networks.split(",") if args.networks else list(QUICK if args.quick else NETWORKS)
    unknown = [n for n in names if n not in every]
    if unknown:
        parser.error(f"--networks: unknown {', '.join(unknown)}; choose from {', '.join(every)}")
    out: dict = {"device": args.device, "workers": args.workers, "curves": {}, "packing": {}, "verdicts": []}
    rows, slowest, worst_packing, monotone = [], 0.0, 1.0, True
    for name in names:
        model, options, batch = every[name]
        net = vmem.models.get(model, **options)
        t0 = time.perf_counter()
        curve = vmem.curve(net, batch, args.device, workers=args.workers)
        seconds = time.perf_counter() - t0
        slowest = max(slowest, seconds)
        mem = [p.memory for p in curve.points]
        times = [p.step_seconds for p in curve.points]
        ok = mem == sorted(set(mem)) and times == sorted(set(times), reverse=True)
        monotone = monotone and ok
        out["curves"][name] = {"seconds": seconds, "monotone": ok, **curve.to_dict()}
        try:
            half = vmem.plan(net, batch, args.device, "auto", memory=curve.keep_all // 2, oversubscribe=True)
            packing = half.packing if half.fits else None
            why = None if half.fits else "auto's plan does not fit half of keep-all"
        except PlanError as exc:
            packing, why = None, str(exc).split(";")[0]
        if packing is not None:
            worst_packing = max(worst_packing, packing)
        out["packing"][name] = {"packing": packing, "why_none": why}
        rows.append(
            (
                name,
                batch,
                f"{seconds:.1f}",
                f"{len(curve.points)}/{curve.planned}",
                vmem.format_bytes(curve.floor),
                vmem.format_bytes(curve.keep_all),
                "yes" if ok else "NO",
                f"{packing:.4f}" if packing is not None else f"- ({why})",
            )
        )
        print(f"{name}: curve in {seconds:.1f} s", file=sys.stderr, flush=True)
    print(table(("network", "batch", "seconds", "points", "floor", "keep-all", "monotone", "packing at 0.5"), rows))
    out["verdicts"] += [
        verdict("curves monotone (1 = every one)", float(monotone), 1.0),
        verdict("slowest curve (s)", slowest, 60.0, at_least=False),
        verdict("worst packed / live peak of auto at 0.5 of keep-all", worst_packing, 1.02, at_least=False),
    ]
    return emit(out, args.json)


if __name__ == "__main__":
    sys.exit(main())
