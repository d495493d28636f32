"""What the ``vmem`` commands share: argument types that refuse what cannot be right, the options every
command that builds a model takes, the model, dataset, policy and device read from the parsed arguments, and
the cheap checks of ``--memory``."""

from __future__ import annotations

import argparse
import math

from ..training.setup import (
    AUTO_FRACTION,
    SEQUENCES,
    auto_fraction,
    check_dataset,
    check_memory,
    host_memory,
    math_option,
    model,
    open_device,
    rebuild_for_classes,
)

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
    "AUTO_FRACTION",
    "auto_fraction",
    "common",
    "math_option",
    "open_device",
    "check_memory",
    "host_memory",
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


def common(
    p: argparse.ArgumentParser,
    model_default: str | None,
    policy_default: str | None = None,
    policy_help: str = "auto where --memory is given, else baseline",
    memory_help: str = "device memory, e.g. 256MiB or 12GB (default 1GiB)",
    simulated: bool = False,
) -> None:
    """Options every command that builds a model takes."""
    which = p.add_mutually_exclusive_group(required=model_default is None)
    which.add_argument(
        "--model",
        default=model_default,
        help="zoo model name (see `vmem models`)" + (f"; default {model_default}" if model_default else ""),
    )
    which.add_argument(
        "--onnx",
        metavar="PATH",
        help="an ONNX model to import instead (one image input, one output; needs vmem[onnx])",
    )
    p.add_argument(
        "--image-size",
        type=positive_int,
        help="input height and width (default: the model's; an ONNX model's where it leaves them open)",
    )
    p.add_argument("--depth", type=positive_int, help="depth, for resnet_cifar")
    p.add_argument(
        "--device",
        default="cpu",
        help="device name: cpu (default), cuda:N"
        + (" or sim:<gpu> (a simulated GPU: plans only)" if simulated else "")
        + " (see vmem devices)",
    )
    p.add_argument("--memory", default=None, help=memory_help)
    p.add_argument(
        "--policy",
        default=policy_default,
        help="policy spec: baseline, layerwise, vdnn-all, vdnn-conv, vdnn-dyn, gist, mirror, chen, echo, auto (all of "
        "them mixed for the budget), with :key=value options (default " + (policy_default or policy_help) + ")",
    )
    p.add_argument(
        "--algos",
        choices=("fit", "memory", "performance"),
        help="convolution algorithms: the fastest with which the plan fits (fit, the default), the leanest or the fastest (adds algos= to --policy)",
    )
    p.add_argument(
        "--precision",
        choices=("fp32", "fp16", "bf16"),
        default="fp32",
        help="what feature maps are stored in (default fp32); fp16 and bf16 keep weights, their gradients and "
        "the optimizer's state in fp32 and fp16 scales its loss (bf16 needs ml_dtypes: vmem[bf16])",
    )
    p.add_argument(
        "--math",
        choices=("tf32", "exact"),
        help="how FP32 convolutions compute on a GPU: tf32 (the CUDA device's default, as PyTorch's) or exact "
        "(FMA; the CPU device computes exact only)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
