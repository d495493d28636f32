"""What the ``vmem`` commands share: argument types that refuse what cannot be right, the options every
command that builds a model takes, the model, dataset, policy and device read from the parsed arguments, and
the cheap checks of ``--memory``."""

from __future__ import annotations

import argparse
import math
import os
from typing import Any, TYPE_CHECKING

from ..units import format_bytes

if TYPE_CHECKING:
    from ..device.base import Device
    from ..graph.network import Network

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


def check_dataset(args: argparse.Namespace, net: Network) -> None:
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
    from .. import models

    if getattr(args, "onnx", None):
        from .. import onnx

        size = getattr(args, "image_size", None)
        return onnx.load(args.onnx, input_shape=(None, size, size) if size else None)  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    if getattr(args, "image_size", None):
        kwargs["image_size"] = args.image_size
    if getattr(args, "depth", None):
        kwargs["depth"] = args.depth
    return models.get(args.model, **kwargs)


def rebuild_for_classes(args: argparse.Namespace, num_classes: int, net: Network | None = None):
    """The model again with ``num_classes`` outputs (the dataset's); an imported model as it is, where its
    outputs can take the dataset's labels."""
    from .. import models

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


#: ``vmem train --memory auto``: the device budget as a fraction of the baseline policy's peak
AUTO_FRACTION = 0.5


def auto_fraction(memory: str | None, policy: str) -> float | None:
    """The fraction of the baseline's peak ``--memory`` asks for (None: a size, or the 1GiB default; left out,
    :data:`AUTO_FRACTION` for a policy made for a budget, ``Policy.needs_budget``)."""
    if memory is None:
        from ..planning import needs_budget

        return AUTO_FRACTION if policy and needs_budget(policy) else None
    if memory != "auto" and not memory.startswith("auto:"):
        return None
    text = memory.partition(":")[2] or str(AUTO_FRACTION)
    try:
        fraction = float(text)
    except ValueError:
        fraction = -1.0
    if not 0 < fraction <= 1:
        raise ValueError(f"--memory {memory}: auto takes a fraction of the baseline's peak in (0, 1], e.g. auto:0.5")
    return fraction


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


def math_option(args: argparse.Namespace) -> dict[str, str]:
    """The device option ``--math`` asks for (none where it is left to the device's default)."""
    return {"math": args.math} if args.math else {}


def open_device(name: str, memory: Any = None, **options: Any) -> Device:
    """The device ``name`` with ``memory`` (its default capacity where None) and ``options``."""
    from ..device import device as make_device

    return make_device(name, **({"memory": memory} if memory is not None else {}), **options)


def check_memory(args: argparse.Namespace) -> None:
    """``--memory`` (a size) within what the device has: a simulated GPU's capacity (unless
    ``--oversubscribe``: a what-if card), the CPU device's host memory."""
    from ..units import parse_bytes

    name = args.device
    if args.memory is None or args.memory == "auto" or str(args.memory).startswith("auto:"):
        return
    wanted = parse_bytes(args.memory, name="--memory")
    if name.startswith("sim:"):
        from ..device import specs as gpu_specs

        capacity = gpu_specs.get(name[4:]).memory
        if wanted > capacity and not getattr(args, "oversubscribe", False):
            raise ValueError(
                f"--memory {args.memory} is more than {name}'s {format_bytes(capacity)}; give at most that, or "
                "--oversubscribe to plan a card with that much memory"
            )
        if wanted > _MOST_MEMORY:
            raise ValueError(f"--memory {args.memory}: more than the {format_bytes(_MOST_MEMORY)} a plan can take")
    elif name in ("cpu", "cpu:0"):
        ram = host_memory()
        if ram is not None and wanted > ram:
            raise ValueError(
                f"--memory {args.memory} is more than this machine's {format_bytes(ram)} of memory (the CPU device's "
                "arena is host memory); give less"
            )


#: The most memory a plan of an oversubscribed simulated GPU takes (the planner's own bound).
_MOST_MEMORY = 1 << 60


def host_memory() -> int | None:
    """Bytes of memory this machine has (None where it cannot tell)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
