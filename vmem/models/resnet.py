"""Residual networks: ImageNet ResNets (batch norm, bottlenecks from 50 up) and pre-activation CIFAR
ResNets of depth 6n+2 (basic blocks) or 9n+2 (bottleneck blocks)."""

from __future__ import annotations

from ..graph import Graph, Node
from ..nn import Add, AvgPool2d, BatchNorm2d, Conv2d, Flatten, Linear, MaxPool2d, ReLU
from ._util import chain

__all__ = ["resnet", "resnet_cifar", "RESNET_LAYERS"]

RESNET_LAYERS = {
    18: ("basic", [2, 2, 2, 2]),
    34: ("basic", [3, 4, 6, 3]),
    50: ("bottleneck", [3, 4, 6, 3]),
    101: ("bottleneck", [3, 4, 23, 3]),
    152: ("bottleneck", [3, 8, 36, 3]),
}


def _conv_bn(g: Graph, x: Node, cin: int, cout: int, k: int, stride: int = 1, relu: bool = True) -> Node:
    x = chain(g, x, Conv2d(cin, cout, k, stride=stride, padding=k // 2, bias=False), BatchNorm2d(cout))
    return g.add(ReLU(), x) if relu else x


def _block(g: Graph, x: Node, cin: int, planes: int, stride: int, kind: str) -> tuple[Node, int]:
    if kind == "basic":
        cout = planes
        y = _conv_bn(g, x, cin, planes, 3, stride)
        y = _conv_bn(g, y, planes, planes, 3, relu=False)
    else:
        cout = planes * 4
        y = _conv_bn(g, x, cin, planes, 1)
        y = _conv_bn(g, y, planes, planes, 3, stride)
        y = _conv_bn(g, y, planes, cout, 1, relu=False)
    shortcut = x if stride == 1 and cin == cout else _conv_bn(g, x, cin, cout, 1, stride, relu=False)
    return g.add(ReLU(), g.add(Add(), y, shortcut)), cout


def resnet(depth: int = 50, num_classes: int = 1000, image_size: int = 224) -> Graph:
    """ResNet-18/34/50/101/152 for ImageNet (torchvision's layout)."""
    if depth not in RESNET_LAYERS:
        raise ValueError(f"resnet depth={depth}: choose one of {sorted(RESNET_LAYERS)}")
    kind, counts = RESNET_LAYERS[depth]
    g = Graph(input_shape=(3, image_size, image_size), name=f"resnet{depth}")
    x = _conv_bn(g, g.input, 3, 64, 7, 2)
    x = g.add(MaxPool2d(3, 2, padding=1), x)
    c = 64
    for stage, (planes, n) in enumerate(zip((64, 128, 256, 512), counts)):
        for i in range(n):
            x, c = _block(g, x, c, planes, 2 if (i == 0 and stage > 0) else 1, kind)
    spatial = g.shape_of(x)[2]
    chain(g, x, AvgPool2d(spatial, 1), Flatten(), Linear(c, num_classes))
    return g


def _preact_block(g: Graph, x: Node, cin: int, planes: int, stride: int, bottleneck: bool) -> tuple[Node, int]:
    cout = planes * 4 if bottleneck else planes
    pre = chain(g, x, BatchNorm2d(cin), ReLU())
    if bottleneck:
        y = chain(
            g,
            pre,
            Conv2d(cin, planes, 1, bias=False),
            BatchNorm2d(planes),
            ReLU(),
            Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False),
            BatchNorm2d(planes),
            ReLU(),
            Conv2d(planes, cout, 1, bias=False),
        )
    else:
        y = chain(
            g,
            pre,
            Conv2d(cin, planes, 3, stride=stride, padding=1, bias=False),
            BatchNorm2d(planes),
            ReLU(),
            Conv2d(planes, planes, 3, padding=1, bias=False),
        )
    if stride != 1 or cin != cout:
        shortcut = g.add(Conv2d(cin, cout, 1, stride=stride, bias=False), pre)  # projection of the pre-activation
    else:
        shortcut = x
    return g.add(Add(), y, shortcut), cout


def resnet_cifar(depth: int = 20, num_classes: int = 10, image_size: int = 32, bottleneck: bool | None = None) -> Graph:
    """Pre-activation ResNet for CIFAR (He et al., 2016): depth 6n+2 with basic blocks (20, 32, 56, 110)
    or 9n+2 with bottlenecks (164, 1001; the default from depth 164 up)."""
    if bottleneck is None:
        bottleneck = depth >= 164
    per = 9 if bottleneck else 6
    if depth < per + 2 or (depth - 2) % per:
        raise ValueError(
            f"resnet_cifar depth={depth}: needs depth = {per}n+2 with {'bottleneck' if bottleneck else 'basic'} blocks"
        )
    n = (depth - 2) // per
    g = Graph(input_shape=(3, image_size, image_size), name=f"resnet_cifar{depth}")
    x = g.add(Conv2d(3, 16, 3, padding=1, bias=False), g.input)
    c = 16
    for stage, planes in enumerate((16, 32, 64)):
        for i in range(n):
            x, c = _preact_block(g, x, c, planes, 2 if (i == 0 and stage > 0) else 1, bottleneck)
    x = chain(g, x, BatchNorm2d(c), ReLU())
    spatial = g.shape_of(x)[2]
    chain(g, x, AvgPool2d(spatial, 1), Flatten(), Linear(c, num_classes))
    return g
