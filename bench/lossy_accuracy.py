"""Validation accuracy on digits with lossy encodings against fp32, same seed, data and epochs.

Runs ``vmem train --json`` (digits_cnn on scikit-learn's digits, the default job) under ``baseline``
(fp32) and under ``gist`` with a lossy value codec: ``dpr=fp8``, ``codec=fixed4`` and ``codec=patch2``
(every stashed feature map that is not binarized is kept in that format between forward and backward).

Final-epoch accuracy on 360 validation images moves by a few points from seed to seed, so every policy
runs with the same seeds (default five) and the target compares means of the per-seed differences.

Target (issue 6): each lossy policy ends within 2 points of the fp32 validation accuracy.

    python bench/lossy_accuracy.py [--epochs 10] [--seeds 0,1,2,3,4] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from _report import emit, table, verdict

POLICIES = ["baseline", "gist:dpr=fp8", "gist:codec=fixed4", "gist:codec=patch2"]


def train(policy: str, epochs: int, seed: int, model: str) -> dict:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "vmem",
            "train",
            "--json",
            "--model",
            model,
            "--policy",
            policy,
            "--epochs",
            str(epochs),
            "--seed",
            str(seed),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated seeds (default 0,1,2,3,4)")
    parser.add_argument("--model", default="digits_cnn")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    acc = {p: [] for p in POLICIES}
    peak = {}
    for seed in seeds:
        for p in POLICIES:
            r = train(p, args.epochs, seed, args.model)
            acc[p].append(100 * r["val_accuracy"])
            peak[p] = r["peak_bytes"]
        if not args.json:
            print(f"seed {seed}: " + ", ".join(f"{p} {acc[p][-1]:.2f}" for p in POLICIES), flush=True)
    drop = {p: sum(b - a for a, b in zip(acc[p], acc["baseline"])) / len(seeds) for p in POLICIES}
    rows = [
        (
            p,
            f"{sum(acc[p]) / len(seeds):.2f}",
            f"{min(acc[p]):.2f}-{max(acc[p]):.2f}",
            f"{-drop[p]:+.2f}",
            f"{peak[p] / 2**20:.2f}",
        )
        for p in POLICIES
    ]
    print(f"{args.model} on digits, {args.epochs} epochs, seeds {args.seeds}")
    print(table(["policy", "mean val acc %", "range", "vs fp32 (points)", "peak MiB"], rows))
    targets = [verdict(f"{p} mean accuracy drop (points)", drop[p], 2.0, at_least=False) for p in POLICIES[1:]]
    return emit(
        {
            "bench": "lossy_accuracy",
            "epochs": args.epochs,
            "seeds": seeds,
            "model": args.model,
            "accuracy": acc,
            "peak_bytes": peak,
            "targets": targets,
        },
        args.json,
    )


if __name__ == "__main__":
    sys.exit(main())
