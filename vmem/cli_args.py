"""What the ``vmem`` commands share (:mod:`vmem.cli` and :mod:`vmem.cli_tools`): argument types that
refuse what cannot be right, and the model, dataset and policy read from the parsed arguments."""

from __future__ import annotations

import argparse
import math
from typing import Any

__all__ = [
    "positive_int",
    "nonnegative_int",
    "nonnegative_float",
    "positive_float",
    "policy_spec",
    "check_dataset",
    "model",
    "rebuild_for_classes",
    "SEQUENCES",
]


def _int_at_least(least: int):
    """An argparse type: an integer of at least ``least``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"{value} must be at least {least}")
        return value

    return parse


#: argparse types: an integer of at least 1, of at least 0
positive_int = _int_at_least(1)
nonnegative_int = _int_at_least(0)


def nonnegative_float(text: str) -> float:
    """An argparse type: a finite number of at least 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number")
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{value} must be at least 0")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite number more than 0."""
    value = nonnegative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be more than 0")
    return value


def policy_spec(args: argparse.Namespace) -> str:
    """The policy spec of ``--policy`` with ``--algos`` folded in (a contradiction between them refused).
    Without ``--policy``: ``auto`` where a budget is given (``--memory``), else ``baseline``."""
    spec = args.policy or ("auto" if getattr(args, "memory", None) is not None else "baseline")
    if getattr(args, "algos", None):
        given = [o.split("=", 1)[1] for o in spec.partition(":")[2].split(",") if o.startswith("algos=")]
        if given and given[0] != args.algos:
            raise ValueError(f"--algos {args.algos} and --policy {spec} (algos={given[0]}) disagree; give one")
        if not given:
            spec += ("," if ":" in spec else ":") + f"algos={args.algos}"
    return spec


#: what each dataset feeds: images (C, H, W) or token sequences (T,)
SEQUENCES = ("reverse",)


def check_dataset(args: argparse.Namespace, net: Any) -> None:
    """A dataset the model can take: images for a model of images, token sequences for a sequence model."""
    takes_tokens = len(tuple(net.input_shape or ())) == 1
    gives_tokens = args.dataset in SEQUENCES
    if takes_tokens != gives_tokens:
        fits = "reverse" if takes_tokens else "digits or synthetic"
        raise ValueError(
            f"{_named(args)} takes {'token sequences' if takes_tokens else 'images'}; --dataset "
            f"{args.dataset} gives {'token sequences' if gives_tokens else 'images'}: use --dataset {fits}"
        )


def _named(args: argparse.Namespace) -> str:
    return f"--onnx {args.onnx}" if getattr(args, "onnx", None) else f"--model {args.model}"


def model(args: argparse.Namespace):
    from . import models

    if getattr(args, "onnx", None):
        from . import onnx

        size = getattr(args, "image_size", None)
        return onnx.load(args.onnx, input_shape=(None, size, size) if size else None)
    kwargs: dict[str, Any] = {}
    if getattr(args, "image_size", None):
        kwargs["image_size"] = args.image_size
    if getattr(args, "depth", None):
        kwargs["depth"] = args.depth
    return models.get(args.model, **kwargs)


def rebuild_for_classes(args: argparse.Namespace, num_classes: int, net: Any = None):
    """The model again with ``num_classes`` outputs (the dataset's); an imported model as it is, where its
    outputs can take the dataset's labels."""
    from . import models

    if getattr(args, "onnx", None):
        net = net if net is not None else model(args)
        outputs = net.output_shape()[-1]
        if num_classes > outputs:
            raise ValueError(
                f"--onnx {args.onnx}: the model gives {outputs} outputs; --dataset {args.dataset} has {num_classes} "
                "classes"
            )
        return net

    kwargs: dict[str, Any] = {"num_classes": num_classes}
    if getattr(args, "image_size", None):
        kwargs["image_size"] = args.image_size
    return models.get(args.model, **kwargs)
