"""Small networks for tests, CPU benchmarks and the default ``vmem train``."""

from __future__ import annotations

from ..graph import Graph, Sequential
from ..nn import AvgPool2d, BatchNorm2d, Conv2d, Flatten, Linear, MaxPool2d, ReLU
from ._util import chain, flat, trace_shape
from .classic import inception

__all__ = ["digits_cnn", "digits_vgg", "mini_googlenet"]


def digits_cnn(num_classes: int = 10, image_size: int = 8, channels: int = 1) -> Sequential:
    """A small CNN for scikit-learn's 8x8 digits (the default of ``vmem train``)."""
    trunk = [
        Conv2d(channels, 32, 3, padding=1),
        ReLU(),
        Conv2d(32, 32, 3, padding=1),
        ReLU(),
        MaxPool2d(2),
        Conv2d(32, 64, 3, padding=1),
        ReLU(),
        MaxPool2d(2),
    ]
    feats = flat(trace_shape(trunk, (channels, image_size, image_size)))
    return Sequential(
        *trunk, Flatten(), Linear(feats, num_classes), input_shape=(channels, image_size, image_size), name="digits_cnn"
    )


def digits_vgg(
    num_classes: int = 10,
    image_size: int = 16,
    channels: int = 1,
    width: int = 8,
    depth: int = 8,
    batchnorm: bool = True,
) -> Sequential:
    """A VGG-style stack for scikit-learn's digits scaled to 16x16 (the default of ``vmem train``).

    ``depth`` 3x3 convolutions of ``width`` channels at full resolution, then two of twice the width at
    half resolution, each followed by batch norm (unless ``batchnorm=False``) and ReLU: as in the networks vDNN was built for, the feature maps stashed for the backward
    pass outweigh the weights many times over, so offloading them lets the network train in about half
    the memory its baseline needs."""
    trunk: list = []
    c = channels
    plan: list[int | str] = [*[width] * depth, "pool", *[2 * width] * 2]
    for out in plan:
        if not isinstance(out, int):
            trunk.append(MaxPool2d(2))
            continue
        trunk += [Conv2d(c, out, 3, padding=1), *([BatchNorm2d(out)] if batchnorm else []), ReLU()]
        c = out
    trunk.append(MaxPool2d(2))
    feats = flat(trace_shape(trunk, (channels, image_size, image_size)))
    return Sequential(
        *trunk, Flatten(), Linear(feats, num_classes), input_shape=(channels, image_size, image_size), name="digits_vgg"
    )


def mini_googlenet(num_classes: int = 10, image_size: int = 32) -> Graph:
    """A GoogLeNet-style network for 32x32 inputs with two inception joins (for tests)."""
    g = Graph(input_shape=(3, image_size, image_size), name="mini_googlenet")
    x = chain(g, g.input, Conv2d(3, 16, 3, padding=1), ReLU())
    x, c = inception(g, x, 16, 8, 8, 16, 4, 8, 8, name="inception1")
    x = g.add(MaxPool2d(2), x)
    x, c = inception(g, x, c, 16, 16, 24, 4, 8, 8, name="inception2")
    spatial = g.shape_of(x)[2]
    chain(g, x, AvgPool2d(spatial, 1), Flatten(), Linear(c, num_classes))
    return g
