"""Networks as the common model libraries build them today, written with vmem's layers: a Vision Transformer
(patches, a class token, a learned position table, pre-norm attention blocks with GELU) and a MobileNetV3-style
network (depthwise separable inverted residuals, hard-swish, squeeze-and-excitation gates). What ``vmem.onnx``
imports from timm's exports, a user can write by hand."""

from __future__ import annotations

import math

import numpy as np

from ..graph import Graph, Node
from ..nn import (
    Add,
    AvgPool2d,
    BatchNorm2d,
    Concat,
    ConstantOp,
    Conv2d,
    Flatten,
    GELU,
    HardSigmoid,
    HardSwish,
    LayerNorm,
    Linear,
    MatMul,
    Mul,
    ReLU,
    Reshape,
    Softmax,
    Take,
    Tokens,
)

__all__ = ["vit", "mobilenet_v3"]


def _positive(name: str, **values: int) -> None:
    for key, value in values.items():
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name}: {key}={value!r} must be a positive int")


def vit(
    num_classes: int = 10,
    image_size: int = 32,
    patch: int = 4,
    dim: int = 64,
    depth: int = 4,
    heads: int = 4,
    mlp: int = 128,
    channels: int = 3,
    name: str = "vit",
) -> Graph:
    """A Vision Transformer (ViT, as timm builds it): the image cut into ``patch`` x ``patch`` patches, each
    embedded by one strided convolution; a learned class token joined in front (``nn.Tokens``) and a learned
    position table added (a trained ``nn.ConstantOp``); ``depth`` pre-norm blocks of ``heads``-head
    self-attention (scaled by 1/sqrt(head size)) and a GELU MLP, each with its residual; a final LayerNorm,
    and the class token's features classified. The class token and position table start at N(0, 0.02)."""
    _positive("vit", num_classes=num_classes, image_size=image_size, patch=patch, dim=dim, depth=depth)
    _positive("vit", heads=heads, mlp=mlp, channels=channels)
    if image_size % patch:
        raise ValueError(f"vit: image_size={image_size} is not a multiple of patch={patch}")
    if dim % heads:
        raise ValueError(f"vit: dim={dim} does not split into {heads} heads")
    tokens = (image_size // patch) ** 2
    rng = np.random.default_rng(0)
    g = Graph(input_shape=(channels, image_size, image_size), name=name)
    x = g.add(Conv2d(channels, dim, patch, stride=patch, init="glorot"), g.input, name="patch_embed")
    x = g.add(Reshape((tokens, dim)), g.add(Flatten(), x))  # (N, T, D): vmem stores a map's features last
    x = g.add(Tokens(0.02 * rng.standard_normal((1, dim))), x, name="cls_token")
    x = g.add(ConstantOp("add", 0.02 * rng.standard_normal((tokens + 1, dim)), trainable=True), x, name="pos_embed")
    head = dim // heads
    for b in range(depth):
        a = g.add(LayerNorm(dim), x, name=f"blocks.{b}.norm1")
        qkv = [g.add(Linear(dim, dim), a, name=f"blocks.{b}.attn.{w}") for w in "qkv"]
        q = g.add(ConstantOp("mul", 1 / math.sqrt(head)), qkv[0])
        pieces = [g.split(t, heads, axis=2) if heads > 1 else [t] for t in (q, *qkv[1:])]
        outs = []
        for h in range(heads):
            qh, kh, vh = (p[h] for p in pieces)
            scores = g.add(MatMul(transpose_b=True), qh, kh)
            outs.append(g.add(MatMul(), g.add(Softmax(axis=2), scores), vh))
        att = g.add(Concat(axis=2), *outs) if heads > 1 else outs[0]
        x = g.add(Add(), x, g.add(Linear(dim, dim), att, name=f"blocks.{b}.attn.proj"))
        m = g.add(LayerNorm(dim), x, name=f"blocks.{b}.norm2")
        m = g.add(Linear(dim, mlp), m, name=f"blocks.{b}.mlp.fc1")
        m = g.add(Linear(mlp, dim), g.add(GELU(), m), name=f"blocks.{b}.mlp.fc2")
        x = g.add(Add(), x, m)
    x = g.add(LayerNorm(dim), x, name="norm")
    cls = g.add(Reshape((dim,)), g.add(Take([0], axis=1), x))
    g.add(Linear(dim, num_classes), cls, name="head")
    return g


#: MobileNetV3-Small's blocks as timm's ``mobilenetv3_small_100`` builds them: (kernel, expanded channels, out
#: channels, squeeze-and-excitation, hard-swish, stride)
_SMALL = (
    (3, 16, 16, True, False, 2),
    (3, 72, 24, False, False, 2),
    (3, 88, 24, False, False, 1),
    (5, 96, 40, True, True, 2),
    (5, 240, 40, True, True, 1),
    (5, 240, 40, True, True, 1),
    (5, 120, 48, True, True, 1),
    (5, 144, 48, True, True, 1),
    (5, 288, 96, True, True, 2),
    (5, 576, 96, True, True, 1),
    (5, 576, 96, True, True, 1),
)


def _divisible(v: float, by: int = 8) -> int:
    """Channels rounded to a multiple of ``by`` (never below 90% of ``v``), as MobileNet scales its widths."""
    out = max(by, int(v + by / 2) // by * by)
    return out + by if out < 0.9 * v else out


def _act(g: Graph, x: Node, hard_swish: bool, name: str) -> Node:
    return g.add(HardSwish() if hard_swish else ReLU(), x, name=name)


def _se(g: Graph, x: Node, channels: int, size: int, name: str) -> Node:
    """A squeeze-and-excitation gate: the map's mean per channel, two 1x1 convolutions (ReLU, hard-sigmoid),
    multiplied into the map (an (N, C, 1, 1) gate broadcast over (N, C, H, W))."""
    squeezed = _divisible(channels / 4)
    s = g.add(AvgPool2d(size), x, name=f"{name}.pool")
    s = g.add(ReLU(), g.add(Conv2d(channels, squeezed, 1), s, name=f"{name}.conv_reduce"))
    s = g.add(HardSigmoid(), g.add(Conv2d(squeezed, channels, 1), s, name=f"{name}.conv_expand"))
    return g.add(Mul(), x, s, name=f"{name}.gate")


def mobilenet_v3(
    num_classes: int = 10, image_size: int = 32, width: float = 1.0, channels: int = 3, name: str = "mobilenet_v3"
) -> Graph:
    """MobileNetV3-Small (as timm's ``mobilenetv3_small_100`` builds it, ``width`` scaling the channels): a
    strided 3x3 stem with hard-swish, eleven inverted residual blocks (a 1x1 expansion, a depthwise k x k
    convolution, a squeeze-and-excitation gate where the block has one, a 1x1 projection; batch norm after
    each convolution; a residual where the shape is kept), a 1x1 convolution to 576 channels, the map's mean,
    a 1024-feature hard-swish layer and the classifier. ``image_size`` a multiple of 32."""
    _positive("mobilenet_v3", num_classes=num_classes, image_size=image_size, channels=channels)
    if image_size % 32:
        raise ValueError(f"mobilenet_v3: image_size={image_size} is not a multiple of 32 (five strided stages)")
    if not width > 0:
        raise ValueError(f"mobilenet_v3: width={width!r} must be positive")
    g = Graph(input_shape=(channels, image_size, image_size), name=name)
    c, size = _divisible(16 * width), image_size // 2
    x = g.add(Conv2d(channels, c, 3, stride=2, padding=1, bias=False), g.input, name="conv_stem")
    x = _act(g, g.add(BatchNorm2d(c), x, name="bn1"), True, "act1")
    for i, (k, expand, out, se, hs, stride) in enumerate(_SMALL):
        e, out = _divisible(expand * width), _divisible(out * width)
        name_ = f"blocks.{i}"
        y = x
        if e != c:  # the 1x1 expansion (the first block's depthwise convolution works on the stem's channels)
            y = g.add(Conv2d(c, e, 1, bias=False), y, name=f"{name_}.conv_pw")
            y = _act(g, g.add(BatchNorm2d(e), y, name=f"{name_}.bn1"), hs, f"{name_}.act1")
        y = g.add(Conv2d(e, e, k, stride=stride, padding=k // 2, groups=e, bias=False), y, name=f"{name_}.conv_dw")
        size //= stride
        y = _act(g, g.add(BatchNorm2d(e), y, name=f"{name_}.bn2"), hs, f"{name_}.act2")
        if se:
            y = _se(g, y, e, size, f"{name_}.se")
        y = g.add(Conv2d(e, out, 1, bias=False), y, name=f"{name_}.conv_pwl")
        y = g.add(BatchNorm2d(out), y, name=f"{name_}.bn3")
        x = g.add(Add(), x, y) if stride == 1 and out == c else y
        c = out
    last = _divisible(576 * width)
    x = g.add(Conv2d(c, last, 1, bias=False), x, name="conv_head")
    x = _act(g, g.add(BatchNorm2d(last), x, name="bn2"), True, "act2")
    x = g.add(Flatten(), g.add(AvgPool2d(size), x, name="global_pool"))
    x = _act(g, g.add(Linear(last, 1024), x, name="conv_head_fc"), True, "act3")
    g.add(Linear(1024, num_classes), x, name="classifier")
    return g
