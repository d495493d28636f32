"""The model zoo: the networks the papers measured (see docs/models.md), plus small ones for the CPU.

``vmem.models.names()`` lists them; ``vmem.models.get(name, num_classes=..., image_size=...)`` builds one
(shapes only: parameters are initialized by ``net.init(seed)`` or by the Trainer). Every network knows its
``input_shape``. ``vmem.models.register(name, builder)`` adds one (also as a decorator), as
``vmem.policies.register`` adds a policy and ``vmem.codecs.register`` a codec: then ``vmem train --model
name`` and ``vmem plan`` take it.
"""

from __future__ import annotations

from typing import Any, Callable

from ..graph import Network
from .classic import alexnet, googlenet, nin, overfeat, vgg, vgg_cifar
from .modern import mobilenet_v3, vit
from .resnet import resnet, resnet_cifar
from .seq import nmt, nmt_small, transformer
from .small import digits_cnn, digits_vgg, mini_googlenet

__all__ = ["get", "names", "info", "register"]

_ZOO: dict[str, tuple[Callable[..., Network], dict[str, Any], str]] = {
    "alexnet": (alexnet, {}, "AlexNet (One Weird Trick), 3x224x224"),
    "overfeat": (overfeat, {}, "OverFeat fast, 3x231x231"),
    "vgg_a": (lambda **kw: vgg("A", name="vgg_a", **kw), {}, "VGG-A (11 layers), 3x224x224"),
    "vgg16": (lambda **kw: vgg("D", name="vgg16", **kw), {}, "VGG-16, 3x224x224"),
    "vgg19": (lambda **kw: vgg("E", name="vgg19", **kw), {}, "VGG-19, 3x224x224"),
    "googlenet": (googlenet, {}, "GoogLeNet v1, 3x224x224"),
    "nin": (nin, {}, "Network in Network (ImageNet), 3x224x224"),
    "vgg_cifar": (vgg_cifar, {}, "VGG for 32x32 inputs (CPU benchmark reference)"),
    "resnet_cifar": (resnet_cifar, {}, "pre-activation CIFAR ResNet, depth=6n+2 or 9n+2 (default 20)"),
    "digits_cnn": (digits_cnn, {}, "small CNN for 8x8 digits"),
    "digits_vgg": (digits_vgg, {}, "VGG-style stack for digits at 16x16, width=, depth= (default of vmem train)"),
    "mini_googlenet": (mini_googlenet, {}, "GoogLeNet-style net with inception joins, 3x32x32"),
    "nmt": (nmt, {}, "Sockeye-style NMT: 2+2 LSTM layers, hidden 512, MLP attention, seq_len= (default 100)"),
    "nmt_small": (nmt_small, {}, "nmt for the CPU: 1+1 LSTM layers, hidden 32, vocabulary 50, sequences of 8"),
    "transformer": (transformer, {}, "transformer encoder stack, layers= (default 6), seq_len=128, dim 512"),
    "vit": (vit, {}, "Vision Transformer (timm's ViT): patch=4, dim=64, depth=4, heads=4 at 3x32x32 by default"),
    "mobilenet_v3": (mobilenet_v3, {}, "MobileNetV3-Small (timm's): hard-swish, SE gates, depthwise, 3x32x32"),
}
for _extra, _depth in ((20, 116), (40, 216), (60, 316), (80, 416)):
    _ZOO[f"vgg{_depth}"] = (
        (lambda e, d: lambda **kw: vgg("D", extra=e, name=f"vgg{d}", **kw))(_extra, _depth),
        {},
        f"VGG-16 with {_extra} more 3x3 convs per group (vDNN), 3x224x224",
    )
for _depth in (18, 34, 50, 101, 152):
    _ZOO[f"resnet{_depth}"] = ((lambda d: lambda **kw: resnet(d, **kw))(_depth), {}, f"ResNet-{_depth}, 3x224x224")


def names() -> list[str]:
    """Every model name ``get`` accepts."""
    return sorted(_ZOO)


def register(
    name: str, builder: Callable[..., Network] | None = None, *, description: str = "", **defaults: Any
) -> Any:
    """Add model ``name``, built by ``builder(**options)`` (a function returning a Network with its
    ``input_shape``; ``num_classes`` and ``image_size`` are passed where given). Used as a decorator
    without ``builder``. A name already taken is refused."""
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"model name {name!r}: a non-empty name without ':'")
    if name in _ZOO:
        raise ValueError(f"model {name!r} is already registered")

    def add(fn: Callable[..., Network]) -> Callable[..., Network]:
        if not callable(fn):
            raise ValueError(f"model {name!r}: the builder must be callable, not {fn!r}")
        _ZOO[name] = (fn, dict(defaults), description or (fn.__doc__ or name).strip().splitlines()[0])
        return fn

    return add if builder is None else add(builder)


def info(name: str) -> str:
    return _lookup(name)[2]


def _lookup(name: str):
    if name not in _ZOO:
        raise ValueError(f"unknown model {name!r}; available: {', '.join(names())}")
    return _ZOO[name]


def get(name: str, num_classes: int | None = None, image_size: int | None = None, **options: Any) -> Network:
    """Build model ``name``; ``num_classes`` and ``image_size`` override its defaults."""
    builder, defaults, _ = _lookup(name)
    kwargs = dict(defaults)
    if num_classes is not None:
        kwargs["num_classes"] = num_classes
    if image_size is not None:
        kwargs["image_size"] = image_size
    kwargs.update(options)
    try:
        return builder(**kwargs)
    except TypeError as exc:
        raise ValueError(f"model {name!r}: {exc}") from None
