"""The convnet-benchmarks ImageNet winners (vDNN's reference models) and their very deep VGG variants.

Every convolution is followed by an in-place ReLU. Pooling floors its output size (Torch's default) except
where a model needs ceil (GoogLeNet and NiN, whose reference implementations used Caffe's ceil rule).
"""

from __future__ import annotations

from ..graph import Graph, Sequential
from ..nn import AvgPool2d, Concat, Conv2d, Dropout, Flatten, Linear, MaxPool2d, ReLU
from ._util import chain, flat, trace_shape

__all__ = ["alexnet", "overfeat", "vgg", "vgg_cifar", "googlenet", "nin", "VGG_CONFIGS"]

VGG_CONFIGS = {
    "A": [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "D": [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"],
    "E": [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M"],
    "cifar": [64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M"],
}


def _classifier(features: int, widths: list[int], num_classes: int, dropout: float, init: str = "glorot") -> list:
    layers: list = [Flatten()]
    for w in widths:
        layers += [Linear(features, w, init=init), ReLU()] + ([Dropout(dropout)] if dropout else [])
        features = w
    layers.append(Linear(features, num_classes, init=init))
    return layers


def _conv_stack(config: list, in_channels: int, init: str = "he") -> list:
    layers: list = []
    c = in_channels
    for item in config:
        if item == "M":
            layers.append(MaxPool2d(2, 2))
        else:
            layers += [Conv2d(c, item, 3, padding=1, init=init), ReLU()]
            c = item
    return layers


def alexnet(num_classes: int = 1000, image_size: int = 224, dropout: float = 0.0) -> Sequential:
    """AlexNet, the "One Weird Trick" variant of convnet-benchmarks (no LRN); input 3x224x224."""
    trunk = [
        Conv2d(3, 64, 11, stride=4, padding=2),
        ReLU(),
        MaxPool2d(3, 2),
        Conv2d(64, 192, 5, padding=2),
        ReLU(),
        MaxPool2d(3, 2),
        Conv2d(192, 384, 3, padding=1),
        ReLU(),
        Conv2d(384, 256, 3, padding=1),
        ReLU(),
        Conv2d(256, 256, 3, padding=1),
        ReLU(),
        MaxPool2d(3, 2),
    ]
    feats = flat(trace_shape(trunk, (3, image_size, image_size)))
    return Sequential(
        *trunk,
        *_classifier(feats, [4096, 4096], num_classes, dropout),
        input_shape=(3, image_size, image_size),
        name="alexnet",
    )


def overfeat(num_classes: int = 1000, image_size: int = 231, dropout: float = 0.0) -> Sequential:
    """OverFeat (fast); input 3x231x231."""
    trunk = [
        Conv2d(3, 96, 11, stride=4),
        ReLU(),
        MaxPool2d(2, 2),
        Conv2d(96, 256, 5),
        ReLU(),
        MaxPool2d(2, 2),
        Conv2d(256, 512, 3, padding=1),
        ReLU(),
        Conv2d(512, 1024, 3, padding=1),
        ReLU(),
        Conv2d(1024, 1024, 3, padding=1),
        ReLU(),
        MaxPool2d(2, 2),
    ]
    feats = flat(trace_shape(trunk, (3, image_size, image_size)))
    return Sequential(
        *trunk,
        *_classifier(feats, [3072, 4096], num_classes, dropout),
        input_shape=(3, image_size, image_size),
        name="overfeat",
    )


def vgg(
    config: str = "D",
    num_classes: int = 1000,
    image_size: int = 224,
    extra: int = 0,
    dropout: float = 0.0,
    name: str | None = None,
) -> Sequential:
    """VGG with configuration A, D (VGG-16) or E (VGG-19). ``extra`` adds that many 3x3 convolutions
    to each of the five groups (vDNN's very deep VGG-116/216/316/416 add 20/40/60/80 to VGG-16).
    Convolutions initialized as torchvision's VGG, N(0, 2/fan_out) (see :func:`vgg_cifar`)."""
    cfg = list(VGG_CONFIGS[config])
    if extra:
        out: list = []
        width = None
        for item in cfg:
            if item == "M":
                out += [width] * extra + ["M"]
            else:
                out.append(item)
                width = item
        cfg = out
    trunk = _conv_stack(cfg, 3, init="he_out")
    feats = flat(trace_shape(trunk, (3, image_size, image_size)))
    return Sequential(
        *trunk,
        *_classifier(feats, [4096, 4096], num_classes, dropout),
        input_shape=(3, image_size, image_size),
        name=name or f"vgg_{config}",
    )


def vgg_cifar(num_classes: int = 10, image_size: int = 32, init: str = "he_out") -> Sequential:
    """VGG for 32x32 inputs, the reference for CPU benchmarks: channels 64,64,M,128,128,M,256,256,M,
    512,512,M, then one fully connected layer (2048 -> classes at 32x32). Its convolutions are initialized
    as torchvision's VGG's, N(0, 2/fan_out): from He's fan-in init, with no batch norm, its logits started
    with a standard deviation near 7 on the synthetic data and SGD diverged or collapsed to chance at any
    rate, in PyTorch as here (``init="he"`` gives that network)."""
    trunk = _conv_stack(VGG_CONFIGS["cifar"], 3, init=init)
    feats = flat(trace_shape(trunk, (3, image_size, image_size)))
    net = Sequential(
        *trunk,
        Flatten(),
        Linear(feats, num_classes),
        input_shape=(3, image_size, image_size),
        name="vgg_cifar",
    )
    net.train_defaults = {"lr": 0.01}  # ten layers without batch norm: SGD at 0.05 diverges
    return net


def inception(g: Graph, x, in_ch: int, n1: int, n3r: int, n3: int, n5r: int, n5: int, proj: int, name: str):
    """GoogLeNet's inception module: four branches concatenated on channels; returns (node, channels)."""
    b1 = chain(g, x, Conv2d(in_ch, n1, 1), ReLU())
    b3 = chain(g, x, Conv2d(in_ch, n3r, 1), ReLU(), Conv2d(n3r, n3, 3, padding=1), ReLU())
    b5 = chain(g, x, Conv2d(in_ch, n5r, 1), ReLU(), Conv2d(n5r, n5, 5, padding=2), ReLU())
    bp = chain(g, x, MaxPool2d(3, 1, padding=1), Conv2d(in_ch, proj, 1), ReLU())
    return g.add(Concat(), b1, b3, b5, bp, name=name), n1 + n3 + n5 + proj


GOOGLENET_MODULES = {
    "3a": (64, 96, 128, 16, 32, 32),
    "3b": (128, 128, 192, 32, 96, 64),
    "4a": (192, 96, 208, 16, 48, 64),
    "4b": (160, 112, 224, 24, 64, 64),
    "4c": (128, 128, 256, 24, 64, 64),
    "4d": (112, 144, 288, 32, 64, 64),
    "4e": (256, 160, 320, 32, 128, 128),
    "5a": (256, 160, 320, 32, 128, 128),
    "5b": (384, 192, 384, 48, 128, 128),
}


def googlenet(num_classes: int = 1000, image_size: int = 224) -> Graph:
    """GoogLeNet v1 without LRN or auxiliary heads; pools use ceil mode; the final average pool covers the
    whole 7x7 map at 224 (and the whole map at other sizes)."""
    g = Graph(input_shape=(3, image_size, image_size), name="googlenet")
    x = chain(
        g,
        g.input,
        Conv2d(3, 64, 7, stride=2, padding=3),
        ReLU(),
        MaxPool2d(3, 2, ceil_mode=True),
        Conv2d(64, 64, 1),
        ReLU(),
        Conv2d(64, 192, 3, padding=1),
        ReLU(),
        MaxPool2d(3, 2, ceil_mode=True),
    )
    c = 192
    for stage in ("3a", "3b", "pool", "4a", "4b", "4c", "4d", "4e", "pool", "5a", "5b"):
        if stage == "pool":
            x = g.add(MaxPool2d(3, 2, ceil_mode=True), x)
        else:
            x, c = inception(g, x, c, *GOOGLENET_MODULES[stage], name=f"inception{stage}")
    spatial = g.shape_of(x)[2]
    x = chain(g, x, AvgPool2d(spatial, 1), Flatten(), Linear(c, num_classes))
    return g


def nin(num_classes: int = 1000, image_size: int = 224) -> Sequential:
    """Network in Network for ImageNet: four mlpconv blocks (a conv and two 1x1 convs, each with ReLU),
    max pools 3/2 (ceil) between them, dropout before the last block, global average pooling."""

    def block(cin, cout, k, s, p, last=None):
        return [
            Conv2d(cin, cout, k, stride=s, padding=p),
            ReLU(),
            Conv2d(cout, cout, 1),
            ReLU(),
            Conv2d(cout, last or cout, 1),
            ReLU(),
        ]

    trunk = (
        block(3, 96, 11, 4, 0)
        + [MaxPool2d(3, 2, ceil_mode=True)]
        + block(96, 256, 5, 1, 2)
        + [MaxPool2d(3, 2, ceil_mode=True)]
        + block(256, 384, 3, 1, 1)
        + [MaxPool2d(3, 2, ceil_mode=True), Dropout(0.5)]
        + block(384, 1024, 3, 1, 1, last=num_classes)
    )
    spatial = trace_shape(trunk, (3, image_size, image_size))[1]
    return Sequential(*trunk, AvgPool2d(spatial, 1), Flatten(), input_shape=(3, image_size, image_size), name="nin")
