"""Mixed precision and the seed's 2-bit patches over it ("Reduce Another 70%"), at the scales this machine allows.

Part 1, planned on a simulated V100 (``sim:v100-16gb``, the roofline with its tensor-core peak): ResNet-50 at
batch 128 in fp32 and fp16 under the baseline (network-wide allocation), layer-wise allocation, and the seed's
scheme, ``gist:codec=patch2,binarize=false,ssdc=false`` (every stashed 4-D map, the convolutions' inputs and
outputs that backward reads, kept in 2-bit 4x4 patches from right after its forward to its first backward).
Every plan and run pins the least-workspace convolution algorithms (``algos=memory``, what these figures were
first measured with), so that they compare storage, not algorithms; the seed's cost with the fastest algorithms
is printed beside. Activation bytes are the planned peak less the weights, their gradients and the optimizer's state (the seed
counted its tensor arena with parameters apart). Also: the feature maps' bytes in fp16 against fp32 (every map
is stored at half the bytes), and patch2's size on an fp16 map whose sides divide by 4.

Part 2, trained on the CPU device: ``vmem train --json`` with a ResNet-style network (``resnet_cifar`` depth 8
on digits at 16x16) in fp32, fp16, bf16 and fp16 with the seed's patches, same seeds, and the default job
(digits_vgg under vdnn-dyn) in fp32, fp16 and bf16.

Targets (issue 32): fp16 activation bytes cut by >= 65% by the seed's scheme (the seed: 67.8%) at <= 10%
predicted step time (the seed: 9.2%); patch2 4.00x over fp16; fp16 and bf16 within 0.5 point of fp32's
validation accuracy (the default job and the ResNet's mean over seeds); fp16 + patches within 2 points (the
seed lost 1.8).

    python bench/mixed_precision.py [--seeds 0,1,2] [--epochs 10] [--device sim:v100-16gb] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import numpy as np
from _report import emit, table, verdict

import vmem
from vmem.planning.report import paper_accounting
from vmem.spec import with_options

SEED_POLICY = "gist:codec=patch2,binarize=false,ssdc=false"
#: the plans and runs below pin the least-workspace convolution algorithms (each policy's default until the
#: defaults became the fastest that fit): the figures compare storage, not algorithms
LEAN = "algos=memory"
PERSISTENT = ("weights", "weight_grads", "optimizer_state")
RESNET = ["--model", "resnet_cifar", "--depth", "8", "--image-size", "16", "--policy", f"baseline:{LEAN}"]
RUNS = {  # name -> (precision, policy override)
    "fp32": ("fp32", None),
    "fp16": ("fp16", None),
    "bf16": ("bf16", None),
    "fp16 + patches": ("fp16", f"{SEED_POLICY},{LEAN}"),
}


def activation_bytes(result) -> int:
    persistent = sum(result.by_category.get(c, {}).get("peak", 0) for c in PERSISTENT)
    return result.peak_bytes - persistent


def planned(device: str, batch: int) -> tuple[dict, float]:
    net = vmem.models.get("resnet50")
    out = {}
    rows = []
    for precision, policy in [
        ("fp32", "baseline"),
        ("fp16", "baseline"),
        ("fp16", "layerwise"),
        ("fp16", SEED_POLICY),
        ("fp32", SEED_POLICY),
    ]:
        r = vmem.plan(
            net,
            batch,
            device,
            with_options(policy, algos="memory"),
            memory="1TiB",
            oversubscribe=True,
            precision=precision,
        )
        maps = paper_accounting(net.build(batch, precision=precision), r)["feature_maps"]
        out[f"{precision} {policy}"] = {
            "activation_bytes": activation_bytes(r),
            "peak_bytes": r.peak_bytes,
            "step_seconds": r.step_seconds,
            "feature_map_bytes": maps,
        }
        rows.append((precision, policy, f"{activation_bytes(r) / 2**30:.2f}", f"{r.step_seconds * 1e3:.1f}"))
    fast = {
        p: vmem.plan(
            net,
            batch,
            device,
            with_options(p, algos="performance"),
            memory="1TiB",
            oversubscribe=True,
            precision="fp16",
        ).step_seconds
        for p in ("baseline", SEED_POLICY)
    }
    fastest_cost = fast[SEED_POLICY] / fast["baseline"] - 1
    print(f"resnet50, batch {batch}, planned on {device} ({LEAN}):")
    print(table(["precision", "policy", "activations GiB", "step ms"], rows))
    print(
        f"with the fastest algorithms instead, fp16: baseline {fast['baseline'] * 1e3:.1f} ms, the seed's scheme "
        f"{fast[SEED_POLICY] * 1e3:.1f} ms ({100 * fastest_cost:+.1f}%: "
        "the encodings' time weighs more against faster convolutions)"
    )
    return out, fastest_cost


def train(extra: list[str], precision: str, policy: str | None, seed: int, epochs: int) -> dict:
    args = [sys.executable, "-m", "vmem", "train", "--json", "--precision", precision, "--seed", str(seed)]
    args += ["--epochs", str(epochs), *extra]
    if policy is not None:
        args += ["--policy", policy]
    out = subprocess.run(args, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="sim:v100-16gb")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--seeds", default="0,1,2", help="seeds of the ResNet runs (default 0,1,2)")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]

    plans, fastest_cost = planned(args.device, args.batch)
    base, layer, seed = (plans[f"fp16 {p}"] for p in ("baseline", "layerwise", SEED_POLICY))
    cut = 1 - seed["activation_bytes"] / base["activation_bytes"]
    cut_layer = 1 - seed["activation_bytes"] / layer["activation_bytes"]
    cost = seed["step_seconds"] / base["step_seconds"] - 1
    maps = plans["fp16 baseline"]["feature_map_bytes"] / plans["fp32 baseline"]["feature_map_bytes"]
    x = np.maximum(np.random.default_rng(0).standard_normal((8, 64, 56, 56)), 0).astype(np.float16)
    patch_ratio = x.nbytes / vmem.codecs.get("patch2").encode(x).nbytes
    print(
        f"seed's scheme over fp16: activations {base['activation_bytes'] / 2**30:.2f} -> "
        f"{seed['activation_bytes'] / 2**30:.2f} GiB ({100 * cut:.1f}% less; {100 * cut_layer:.1f}% less than "
        f"layer-wise), step {100 * cost:+.1f}%; fp16 / fp32 feature-map bytes {maps:.4f}; patch2 on an fp16 "
        f"(8, 64, 56, 56) map: {patch_ratio:.2f}x"
    )

    acc: dict[str, list[float]] = {name: [] for name in RUNS}
    peak: dict[str, int] = {}
    for s in seeds:
        for name, (precision, policy) in RUNS.items():
            r = train(RESNET, precision, policy, s, args.epochs)
            acc[name].append(100 * r["val_accuracy"])
            peak[name] = r["peak_bytes"]
        if not args.json:
            print(f"seed {s}: " + ", ".join(f"{n} {acc[n][-1]:.2f}" for n in RUNS), flush=True)
    mean = {n: sum(v) / len(v) for n, v in acc.items()}
    main_job = {p: 100 * train([], p, None, 0, args.epochs)["val_accuracy"] for p in ("fp32", "fp16", "bf16")}
    rows = [
        (n, f"{mean[n]:.2f}", f"{min(acc[n]):.2f}-{max(acc[n]):.2f}", f"{mean[n] - mean['fp32']:+.2f}", peak[n])
        for n in RUNS
    ]
    print(f"resnet_cifar depth 8 on digits 16x16, {args.epochs} epochs, seeds {args.seeds}:")
    print(table(["run", "mean val acc %", "range", "vs fp32", "peak bytes"], rows))
    print("default job (vmem train --precision P): " + ", ".join(f"{p} {a:.2f}%" for p, a in main_job.items()))

    targets = [
        verdict("fp16 ResNet-50 activation cut by the seed's patches", cut, 0.65),
        verdict("seed's patches: predicted step time cost", cost, 0.10, at_least=False),
        verdict("patch2 over fp16, sides divisible by 4", patch_ratio, 4.0),
        verdict("fp16 / fp32 feature-map bytes", maps, 0.5, at_least=False),
        verdict("fp16 default job accuracy drop (points)", main_job["fp32"] - main_job["fp16"], 0.5, at_least=False),
        verdict("bf16 default job accuracy drop (points)", main_job["fp32"] - main_job["bf16"], 0.5, at_least=False),
        verdict("fp16 ResNet mean accuracy drop (points)", mean["fp32"] - mean["fp16"], 0.5, at_least=False),
        verdict("bf16 ResNet mean accuracy drop (points)", mean["fp32"] - mean["bf16"], 0.5, at_least=False),
        verdict(
            "fp16 + patches ResNet mean accuracy drop (points)",
            mean["fp32"] - mean["fp16 + patches"],
            2.0,
            at_least=False,
        ),
    ]
    return emit(
        {
            "bench": "mixed_precision",
            "device": args.device,
            "batch": args.batch,
            "plans": plans,
            "fastest_algorithms_seed_cost": fastest_cost,
            "seeds": seeds,
            "epochs": args.epochs,
            "accuracy": acc,
            "peak_bytes": peak,
            "main_job": main_job,
            "targets": targets,
        },
        args.json,
    )


if __name__ == "__main__":
    sys.exit(main())
