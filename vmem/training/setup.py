"""A run's set-up from its options (``vmem train``'s, ``vmem plan``'s, a :class:`~vmem.training.run.RunConfig`):
the model, checked against the dataset and rebuilt for its classes, the device opened as asked, ``memory``
checked against what the device has, and ``memory="auto[:FRACTION]"``'s budget. Each reads its options by
name from any object that has them (parsed arguments or a RunConfig)."""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Any, Protocol

from ..units import format_bytes

if TYPE_CHECKING:
    from ..device.base import Device
    from ..graph.network import Network

__all__ = [
    "Options",
    "SEQUENCES",
    "AUTO_FRACTION",
    "PLANNING_ARENA",
    "check_dataset",
    "model",
    "rebuild_for_classes",
    "auto_fraction",
    "math_option",
    "open_device",
    "check_memory",
    "host_memory",
    "auto_memory",
    "budget_line",
]


class Options(Protocol):
    """The options a run's set-up reads, by name (parsed arguments have them; so does a RunConfig)."""

    @property
    def model(self) -> str | None: ...

    @property
    def onnx(self) -> str | None: ...

    @property
    def image_size(self) -> int | None: ...

    @property
    def depth(self) -> int | None: ...

    @property
    def dataset(self) -> str: ...

    @property
    def device(self) -> str: ...

    @property
    def memory(self) -> str | None: ...

    @property
    def batch(self) -> int | None: ...

    @property
    def precision(self) -> str: ...

    @property
    def math(self) -> str | None: ...


#: what each dataset feeds: images (C, H, W) or token sequences (T,)
SEQUENCES = ("reverse",)


def check_dataset(args: Options, net: Network) -> None:
    """A dataset the model can take: images for a model of images, token sequences for a sequence model."""
    takes_tokens = len(tuple(net.input_shape or ())) == 1
    gives_tokens = args.dataset in SEQUENCES
    if takes_tokens != gives_tokens:
        fits = "reverse" if takes_tokens else "digits or synthetic"
        raise ValueError(
            f"{_named(args)} takes {'token sequences' if takes_tokens else 'images'}; --dataset "
            f"{args.dataset} gives {'token sequences' if gives_tokens else 'images'}: use --dataset {fits}"
        )


def _named(args: Options) -> str:
    return f"--onnx {args.onnx}" if getattr(args, "onnx", None) else f"--model {args.model}"


def model(args: Options):
    from .. import models

    if getattr(args, "onnx", None):
        from .. import onnx

        size = getattr(args, "image_size", None)
        return onnx.load(args.onnx, input_shape=(None, size, size) if size else None)  # type: ignore[arg-type]
    assert args.model is not None  # a zoo model where no ONNX file is given
    kwargs: dict[str, Any] = {}
    if getattr(args, "image_size", None):
        kwargs["image_size"] = args.image_size
    if getattr(args, "depth", None):
        kwargs["depth"] = args.depth
    return models.get(args.model, **kwargs)


def rebuild_for_classes(args: Options, num_classes: int, net: Network | None = None):
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

    assert args.model is not None  # a zoo model where no ONNX file is given
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


def math_option(args: Options) -> dict[str, str]:
    """The device option ``--math`` asks for (none where it is left to the device's default)."""
    return {"math": args.math} if args.math else {}


def open_device(name: str, memory: Any = None, **options: Any) -> Device:
    """The device ``name`` with ``memory`` (its default capacity where None) and ``options``."""
    from ..device import device as make_device

    return make_device(name, **({"memory": memory} if memory is not None else {}), **options)


def check_memory(args: Options) -> None:
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


#: The arena of a CUDA device opened only to read its catalog and spec: planning needs no GPU memory.
PLANNING_ARENA = 1 << 20


def auto_memory(
    args: Options, net: Network, fraction: float, policy: str, device: Device | None = None
) -> tuple[int, int, bool]:
    """``memory="auto:FRACTION"``: (the budget, the baseline's peak, whether the budget had to be raised).

    The budget is that fraction of the baseline policy's peak (with the least-workspace algorithms: the
    least it needs) at ``args.batch``, rounded up to KiB, with the device's own algorithms (on a GPU,
    cuDNN's: the device is opened with a tiny arena to read them); never below the smallest budget
    ``policy`` trains in, where it is raised to that. ``device``: one already open for planning (else it is
    opened here)."""
    from ..planning import fraction_budget

    assert args.batch is not None
    opened: contextlib.AbstractContextManager[Device | str]
    if device is not None:
        opened = contextlib.nullcontext(device)
    elif args.device.startswith("cuda"):
        opened = open_device(args.device, PLANNING_ARENA)
    else:
        opened = contextlib.nullcontext(args.device)
    with opened as planning:
        return fraction_budget(net, args.batch, planning, policy, fraction, precision=args.precision)


def budget_line(memory: int, needs: int, fraction: float, raised: bool, policy: str, batch: int) -> str:
    """The line a run's ``memory="auto:FRACTION"`` budget is told in."""
    if raised:
        return (
            f"device memory {format_bytes(memory)}: the smallest budget {policy} trains in at batch "
            f"{batch}, above the {fraction:.0%} of the {format_bytes(needs)} the baseline policy needs that "
            f"--memory auto:{fraction:g} asks for"
        )
    return (
        f"device memory {format_bytes(memory)}: {fraction:.0%} of the {format_bytes(needs)} the baseline policy "
        f"needs (--memory auto:{fraction:g})"
    )
