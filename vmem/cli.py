"""The ``vmem`` command: train, plan, list models and devices. Every command has ``--help`` and ``--json``."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Sequence

from .units import format_bytes

__all__ = ["main"]


def _policy_spec(args: argparse.Namespace) -> str:
    spec = args.policy
    if getattr(args, "algos", None):
        spec += ("," if ":" in spec else ":") + f"algos={args.algos}"
    return spec


def _model(args: argparse.Namespace):
    from . import models

    kwargs: dict[str, Any] = {}
    if getattr(args, "image_size", None):
        kwargs["image_size"] = args.image_size
    if getattr(args, "depth", None):
        kwargs["depth"] = args.depth
    return models.get(args.model, **kwargs)


def cmd_train(args: argparse.Namespace) -> int:
    import numpy as np

    from . import data, optim
    from .trainer import Trainer

    net = _model(args)
    train, val = data.load(args.dataset, input_shape=net.input_shape, seed=args.seed)
    if train.num_classes != net.output_shape()[1]:
        net = _rebuild_for_classes(args, train.num_classes)
    if args.optimizer == "sgd":
        opt = optim.SGD(lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    else:
        opt = optim.Adam(lr=args.lr, weight_decay=args.weight_decay)
    t0 = time.perf_counter()
    with Trainer(net, device=args.device, memory=args.memory, policy=_policy_spec(args), optimizer=opt,
                 seed=args.seed) as trainer:
        if not args.json:
            print(f"training {net.name} on {args.dataset} ({len(train)} train / {len(val)} val), batch {args.batch}, "
                  f"policy {trainer.policy.spec}, device {trainer.device!r}", flush=True)
        history = trainer.fit(train, epochs=args.epochs, val=val, batch_size=args.batch,
                              progress=not args.json)
        if args.save:
            trainer.save(args.save)
    wall = time.perf_counter() - t0
    last = history.last
    result = {
        "model": net.name, "dataset": args.dataset, "policy": _policy_spec(args), "device": args.device,
        "memory": args.memory, "batch": args.batch, "epochs": args.epochs, "seed": args.seed,
        "train_loss": last.train_loss, "val_loss": last.val_loss, "val_accuracy": last.val_accuracy,
        "step_seconds": float(np.median([e.step_seconds for e in history.epochs])),
        "peak_bytes": max(e.peak_bytes for e in history.epochs),
        "average_bytes": float(np.mean([e.average_bytes for e in history.epochs])),
        "offloaded_bytes": max(e.offloaded_bytes for e in history.epochs),
        "stall_seconds": float(np.mean([e.stall_seconds for e in history.epochs])),
        "wall_seconds": wall, "history": history.to_dict(),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"done in {wall:.1f} s: val accuracy {last.val_accuracy:.2%}, train loss {last.train_loss:.4f}, "
              f"step time {result['step_seconds'] * 1e3:.1f} ms (median), peak device memory "
              f"{format_bytes(result['peak_bytes'])} (average {format_bytes(result['average_bytes'])})")
    return 0


def _rebuild_for_classes(args: argparse.Namespace, num_classes: int):
    from . import models

    kwargs: dict[str, Any] = {"num_classes": num_classes}
    if getattr(args, "image_size", None):
        kwargs["image_size"] = args.image_size
    return models.get(args.model, **kwargs)


def cmd_plan(args: argparse.Namespace) -> int:
    from .planner import plan

    net = _model(args)
    result = plan(net, args.batch, args.device, _policy_spec(args), memory=args.memory)
    baseline = plan(net, args.batch, args.device, "baseline:algos=performance", memory=args.memory)
    out = result.to_dict()
    out.update(model=net.name, baseline_step_seconds=baseline.step_seconds)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(result.table())
        print(f"fits: {result.fits}; offloaded {format_bytes(result.offloaded_bytes)}")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from . import models

    rows = []
    for name in models.names():
        net = models.get(name)
        rows.append({"name": name, "input_shape": list(net.input_shape), "params": net.num_params(),
                     "description": models.info(name)})
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        width = max(len(r["name"]) for r in rows)
        for r in rows:
            shape = "x".join(map(str, r["input_shape"]))
            print(f"{r['name']:<{width}}  {shape:>11}  {r['params'] / 1e6:8.2f}M params  {r['description']}")
    return 0


def cmd_devices(args: argparse.Namespace) -> int:
    from .device import names

    rows = [{"name": n, "kind": n.split(":")[0]} for n in names()]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for r in rows:
            print(f"{r['name']}  (the default; memory= sets its capacity, pcie_gbps= throttles copies)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vmem", description="Train deep networks in a GPU memory budget.")
    parser.add_argument("--version", action="version", version=f"vmem {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def common(p: argparse.ArgumentParser, model_default: str | None) -> None:
        p.add_argument("--model", default=model_default, required=model_default is None,
                       help="zoo model name (see `vmem models`)" + (f"; default {model_default}" if model_default else ""))
        p.add_argument("--image-size", type=int, help="input height and width (default: the model's)")
        p.add_argument("--depth", type=int, help="depth, for resnet_cifar")
        p.add_argument("--device", default="cpu", help="device name (default cpu)")
        p.add_argument("--memory", default=None, help="device memory, e.g. 256MiB or 12GB (default 1GiB)")
        p.add_argument("--policy", default="baseline", help="policy spec, e.g. baseline or baseline:algos=performance")
        p.add_argument("--algos", choices=("memory", "performance"), help="convolution algorithms (adds algos= to --policy)")
        p.add_argument("--json", action="store_true", help="print one JSON object instead of text")

    p = sub.add_parser("train", help="train a model on a dataset", description="Train a zoo model with vmem.Trainer.")
    common(p, "digits_cnn")
    p.add_argument("--dataset", default="digits", choices=("digits", "synthetic"), help="default digits")
    p.add_argument("--batch", type=int, default=32, help="batch size (default 32)")
    p.add_argument("--epochs", type=int, default=10, help="epochs (default 10)")
    p.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    p.add_argument("--lr", type=float, default=0.05, help="learning rate (default 0.05)")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default 0.9)")
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save", metavar="PATH", help="write a checkpoint (.npz) at the end")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("plan", help="plan a training step without running it",
                       description="Replay one step's allocations under a policy and print the plan.")
    common(p, None)
    p.add_argument("--batch", type=int, required=True)
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("models", help="list the model zoo")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("devices", help="list devices")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_devices)
    return parser


def _version() -> str:
    from . import __version__

    return __version__


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except BrokenPipeError:  # e.g. `vmem models | head`
        sys.stderr.close()
        return 0
    except (ValueError, MemoryError, ImportError) as exc:  # user errors: one clear line, no traceback
        print(f"vmem {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
