"""``vmem trace``: a few steps trained, the last one's timeline written (Chrome trace, memory plot, layers)."""

from __future__ import annotations

import argparse
import os
import json
from typing import Any

from ..units import format_bytes
from .options import common, nonnegative_int, positive_float, positive_int

__all__ = ["cmd_trace", "add_parser"]


def cmd_trace(args: argparse.Namespace) -> int:
    """Train a few steps and write the last step's Chrome trace, memory plot and per-layer table."""
    from .options import model as _model, policy_spec as _policy_spec, rebuild_for_classes as _rebuild_for_classes
    from pathlib import Path

    import numpy as np

    from .. import data, optim
    from .._files import checked_output, write_output
    from ..device import device as make_device
    from ..planning import layer_table
    from ..training import Trainer

    from .options import check_dataset as _check_dataset

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {args.out}: is a file; give a folder (made if it does not exist)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--out {args.out}: cannot make the folder ({exc.strerror})") from None
    if not os.access(out, os.W_OK):
        raise ValueError(f"--out {args.out}: the folder is not writable")
    for name, what in (("trace.json", "a trace"), ("layers.txt", "a layer table"), ("memory.png", "a plot")):
        checked_output(out / name, what)  # before training: a link, a FIFO or a folder there is refused
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
    write_output(out / "layers.txt", lambda f: f.write(table + "\n"), "a layer table")
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


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "trace",
        help="run a few steps; write a Chrome trace, a memory plot, a layer table",
        description="Train a few steps and write the last step's timeline: trace.json (open in "
        "Perfetto or chrome://tracing), memory.png and layers.txt, into --out.",
    )
    common(p, "vgg_cifar")
    p.add_argument("--dataset", default="synthetic", choices=("digits", "synthetic", "reverse"))
    p.add_argument("--batch", type=positive_int, default=64)
    p.add_argument("--steps", type=positive_int, default=3, help="steps to run; the last is written (default 3)")
    p.add_argument(
        "--pcie-gbps",
        type=positive_float,
        help="throttle host-device copies to this many GB/s (more than 0; leave it out for an unthrottled link)",
    )
    p.add_argument("--seed", type=nonnegative_int, default=0)
    p.add_argument("--out", default="vmem-trace", help="output folder (default vmem-trace)")
    p.set_defaults(func=cmd_trace)
