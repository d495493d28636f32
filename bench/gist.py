"""Activation footprint with Gist's encodings, and each codec's compression, on real activations.

vgg_cifar at batch 128 on the CPU device is first trained for a few steps on digits (scaled to 3x32x32)
with the baseline, so that the feature maps are those of a network that learns. Then one training step
runs under each policy from those weights and the pool's peak is measured. The activation footprint is
the peak less the weights, weight gradients and optimizer state (what Gist measured: feature maps,
gradient maps, workspace and encodings). Ratios divide the baseline's footprint (network-wide
allocation, as Torch and Caffe) by each policy's; the layer-wise plan without encodings is shown too,
so that what the encodings add beyond layer-wise allocation is visible.

Per-codec compression: one step of ``vdnn-all:codec=<codec>`` offloads every stashed buffer through the
codec; the bytes that crossed the link are compared with the buffers' size.

Targets (issue 6): footprint reduced at least 1.5x by lossless ``gist`` and at least 2.0x by
``gist:dpr=fp8``.

    python bench/gist.py [--batch 128] [--warmup 10] [--json]
"""

from __future__ import annotations

import argparse
import sys


from _report import emit, table, verdict

import vmem
from vmem.optim import SGD

POLICIES = [
    "baseline",
    "gist:ssdc=false,binarize=false",
    "gist",
    "gist:dpr=fp16",
    "gist:dpr=fp10",
    "gist:dpr=fp8",
    "gist:codec=fixed4",
    "gist:codec=patch2",
]
CODECS = ["zvc", "ssdc", "fp16", "fp10", "fp8", "fixed8", "fixed4", "patch2"]
PERSISTENT = ("weights", "weight_grads", "optimizer_state")


def one_step(net, weights, policy: str, x, y, memory: str) -> tuple[int, int, vmem.Plan, object]:
    """Peak activation bytes of one step from ``weights`` under ``policy``, and the step's report."""
    net.params.update({k: v.copy() for k, v in weights.items()})
    with vmem.Trainer(net, device="cpu", policy=policy, memory=memory, optimizer=SGD(lr=0.01, momentum=0.9)) as tr:
        report = tr.step(x, y)
        stats = tr.device.pool.stats()
        persistent = sum(stats.by_category[c].in_use for c in PERSISTENT)
        return report.peak_bytes - persistent, persistent, tr.plans[len(x)], report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=10, help="baseline steps on digits first (default 10)")
    parser.add_argument("--memory", default="2GiB")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    net = vmem.models.get("vgg_cifar")
    train, _ = vmem.data.digits(image_size=32, channels=3)
    b = args.batch
    with vmem.Trainer(
        net, device="cpu", policy="baseline", memory=args.memory, optimizer=SGD(lr=0.01, momentum=0.9)
    ) as tr:
        for i in range(args.warmup):
            lo = (i * b) % (len(train) - b)
            report = tr.step(train.x[lo : lo + b], train.y[lo : lo + b])
        weights = {k: v.copy() for k, v in net.params.items()}
    x, y = train.x[:b], train.y[:b]
    if not args.json:
        print(f"vgg_cifar batch {b}, after {args.warmup} baseline steps on digits (loss {report.loss:.3f})")
    rows, results = [], {}
    base = None
    for policy in POLICIES:
        act, persistent, plan, rep = one_step(net, weights, policy, x, y, args.memory)
        base = base or act
        enc = plan.by_category.get("encoded", {}).get("peak", 0)
        results[policy] = {
            "activation_bytes": act,
            "ratio": base / act,
            "peak_bytes": act + persistent,
            "planned_encoded_peak": enc,
            "lossless": policy in POLICIES[:3],
        }
        rows.append((policy, f"{act / 2**20:.1f}", f"{base / act:.2f}", "yes" if policy in POLICIES[:3] else "no"))
    print(table(["policy", "activations MiB", "x smaller", "lossless"], rows))
    raw = None
    crows, cresults = [], {}
    for codec in CODECS:
        _, _, plan, rep = one_step(net, weights, f"vdnn-all:codec={codec}", x, y, args.memory)
        raw = raw or vmem.plan(net, b, "cpu", "vdnn-all", memory=args.memory).offloaded_bytes
        cresults[codec] = {"encoded_bytes": rep.offloaded_bytes, "raw_bytes": raw, "ratio": raw / rep.offloaded_bytes}
        crows.append((codec, f"{rep.offloaded_bytes / 2**20:.1f}", f"{raw / rep.offloaded_bytes:.2f}"))
    print(f"every stashed buffer ({raw / 2**20:.1f} MiB) through each codec:")
    print(table(["codec", "encoded MiB", "compression"], crows))
    targets = [
        verdict("lossless gist activation footprint reduction", results["gist"]["ratio"], 1.5),
        verdict("gist:dpr=fp8 activation footprint reduction", results["gist:dpr=fp8"]["ratio"], 2.0),
    ]
    return emit(
        {
            "bench": "gist",
            "batch": b,
            "warmup": args.warmup,
            "policies": results,
            "codecs": cresults,
            "targets": targets,
        },
        args.json,
    )


if __name__ == "__main__":
    sys.exit(main())
