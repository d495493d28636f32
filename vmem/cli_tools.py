"""The ``vmem trace`` and ``vmem bench`` commands (``vmem.cli`` builds their parsers)."""

from __future__ import annotations

import argparse
import os
import json
from typing import Any

from .units import format_bytes

__all__ = ["cmd_trace", "cmd_bench"]


def cmd_trace(args: argparse.Namespace) -> int:
    """Train a few steps and write the last step's Chrome trace, memory plot and per-layer table."""
    from .cli_args import model as _model, policy_spec as _policy_spec, rebuild_for_classes as _rebuild_for_classes
    from pathlib import Path

    import numpy as np

    from . import data, optim
    from .device import device as make_device
    from .report import layer_table
    from .training import Trainer

    from .cli_args import check_dataset as _check_dataset

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {args.out}: is a file; give a folder (made if it does not exist)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--out {args.out}: cannot make the folder ({exc.strerror})") from None
    if not os.access(out, os.W_OK):
        raise ValueError(f"--out {args.out}: the folder is not writable")
    net = _model(args)
    _check_dataset(args, net)
    train, _ = data.load(args.dataset, input_shape=net.input_shape, seed=args.seed, n=max(args.batch, 256))
    if train.num_classes != net.output_shape()[-1]:
        net = _rebuild_for_classes(args, train.num_classes, net)
    options: dict[str, Any] = {"memory": args.memory} if args.memory else {}
    if args.pcie_gbps:
        options["pcie_gbps"] = args.pcie_gbps
    if args.math:
        options["math"] = args.math
    dev = make_device(args.device, **options)
    try:
        with Trainer(
            net, device=dev, policy=_policy_spec(args), optimizer=optim.SGD(lr=0.01, momentum=0.9), seed=args.seed
        ) as trainer:
            batches = train.batches(args.batch, shuffle=True, rng=np.random.default_rng(args.seed), drop_last=True)
            report = None
            for _, (x, y) in zip(range(args.steps), batches):
                report = trainer.step(x, y)
            if report is None:
                raise ValueError(f"the dataset has no full batch of {args.batch}")
            plan = trainer.plans[args.batch]
    finally:
        dev.close()
    trace_path, plot_path = out / "trace.json", out / "memory.png"
    report.timeline.write_chrome_trace(trace_path)
    files = {"trace": str(trace_path), "table": str(out / "layers.txt")}
    table = layer_table(plan, report.timeline)
    (out / "layers.txt").write_text(table + "\n")
    try:
        report.timeline.plot(plot_path, title=f"{net.name} batch {args.batch}, {plan.policy}")
        files["plot"] = str(plot_path)
    except ImportError as exc:
        files["plot_error"] = str(exc)
    summary = {
        "model": net.name,
        "policy": plan.policy,
        "batch": args.batch,
        "step_seconds": report.seconds,
        "peak_bytes": report.peak_bytes,
        "average_bytes": report.average_bytes,
        "offloaded_bytes": report.offloaded_bytes,
        "stall_seconds": report.stall_seconds,
        "files": files,
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(table)
        print(
            f"step {report.seconds * 1e3:.1f} ms, stall {report.stall_seconds * 1e3:.1f} ms, peak "
            f"{format_bytes(report.peak_bytes)}, average {format_bytes(report.average_bytes)}, offloaded "
            f"{format_bytes(report.offloaded_bytes)}"
        )
        for kind, path in files.items():
            print(f"{kind}: {path}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from .benchmarks import DEFAULT_SIZES, bandwidth
    from .device import device as make_device

    options: dict[str, Any] = {"memory": args.memory or "1GiB"}
    if args.pcie_gbps:
        options["pcie_gbps"] = args.pcie_gbps
    if args.codec:
        from . import codecs

        codecs.get(args.codec)  # a clear error before the device starts
        try:
            densities = [float(d) for d in args.density.split(",")]
        except ValueError:
            densities = [-1.0]
        if any(not 0 <= d <= 1 for d in densities):
            raise ValueError(
                f"--density {args.density!r}: comma-separated fractions of nonzeros from 0 to 1, e.g. 0.1,0.5,0.9"
            )
    sizes = args.sizes.split(",") if args.sizes else (["4MiB", "16MiB", "64MiB"] if args.codec else list(DEFAULT_SIZES))
    dev = make_device(args.device, **options)
    try:
        if args.codec:
            return _bench_codec(dev, args, sizes, densities)
        rows = bandwidth(dev, sizes, rounds=args.rounds, progress=not args.json)
    finally:
        dev.close()
    if args.json:
        print(
            json.dumps(
                {"bench": "bandwidth", "device": args.device, "pcie_gbps": args.pcie_gbps, "rows": rows}, indent=2
            )
        )
        return 0
    print(
        f"host-device copy bandwidth on {args.device}"
        + (f", link {args.pcie_gbps:g} GB/s" if args.pcie_gbps else "")
        + " (GB/s, best of rounds)"
    )
    print(f"{'size':>12}  {'d2h pinned':>10}  {'h2d pinned':>10}  {'d2h pageable':>12}  {'h2d pageable':>12}")
    for r in rows:
        print(
            f"{format_bytes(r['bytes']):>12}  {r['d2h_pinned_gbps']:10.2f}  {r['h2d_pinned_gbps']:10.2f}  "
            f"{r['d2h_pageable_gbps']:12.2f}  {r['h2d_pageable_gbps']:12.2f}"
        )
    return 0


def _bench_codec(dev: Any, args: argparse.Namespace, sizes: list[str], densities: list[float]) -> int:
    from .benchmarks import codec_bandwidth

    rows = codec_bandwidth(dev, args.codec, sizes, densities, rounds=args.rounds, progress=not args.json)
    if args.json:
        print(
            json.dumps(
                {
                    "bench": "bandwidth",
                    "device": args.device,
                    "pcie_gbps": args.pcie_gbps,
                    "codec": args.codec,
                    "rows": rows,
                },
                indent=2,
            )
        )
        return 0
    print(
        f"offload through {args.codec} on {args.device}"
        + (f", link {args.pcie_gbps:g} GB/s" if args.pcie_gbps else "")
        + ": effective GB/s (uncompressed bytes per second, codec included) against a plain pinned copy"
    )
    print(
        f"{'size':>10}  {'density':>7}  {'ratio':>6}  {'link d2h':>8}  {'offload':>8}  {'link h2d':>8}  {'prefetch':>8}"
    )
    for r in rows:
        print(
            f"{format_bytes(r['bytes']):>10}  {r['density']:7.2f}  {r['bytes'] / r['encoded_bytes']:6.2f}  "
            f"{r['link_d2h_gbps']:8.2f}  {r['offload_gbps']:8.2f}  {r['link_h2d_gbps']:8.2f}  {r['prefetch_gbps']:8.2f}"
        )
    return 0
