"""Layers: math on an array namespace, shapes, costs, and what backward needs (see :mod:`vmem.nn.base`)."""

from .activation import GELU, Clip, Dropout, Erf, HardSigmoid, HardSwish, ReLU, Sigmoid, SiLU, Tanh
from .arith import ConstantOp, Div, Mul, Power, Sub
from .base import PASSES, AuxSpec, Ctx, Layer, ParamSpec, logical, physical
from .conv import Conv2d
from .join import Add, Concat, Tokens
from .linear import Flatten, Linear
from .loss import SoftmaxCrossEntropy
from .norm import BatchNorm2d, LocalResponseNorm
from .pooling import AvgPool2d, MaxPool2d, Pad2d
from .attention import LayerNorm, MatMul, Mean, Softmax
from .select import Expand, Select
from .seq import (
    Embedding,
    ExpandDims,
    Identity,
    LengthMask,
    StepMask,
    Reshape,
    Split,
    Take,
    Transpose,
)

__all__ = [
    "Layer",
    "Ctx",
    "ParamSpec",
    "AuxSpec",
    "physical",
    "logical",
    "PASSES",
    "Conv2d",
    "Linear",
    "ReLU",
    "Clip",
    "Sigmoid",
    "Tanh",
    "HardSigmoid",
    "HardSwish",
    "SiLU",
    "Erf",
    "Power",
    "GELU",
    "Mul",
    "Sub",
    "Div",
    "ConstantOp",
    "Select",
    "Expand",
    "MaxPool2d",
    "AvgPool2d",
    "Pad2d",
    "BatchNorm2d",
    "LocalResponseNorm",
    "Dropout",
    "Flatten",
    "Add",
    "Concat",
    "Tokens",
    "SoftmaxCrossEntropy",
    "Embedding",
    "Split",
    "Reshape",
    "ExpandDims",
    "Transpose",
    "Softmax",
    "MatMul",
    "LayerNorm",
    "LengthMask",
    "StepMask",
    "Identity",
    "Mean",
    "Take",
]
