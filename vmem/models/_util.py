"""Helpers for building the zoo: shape inference while stacking layers."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..graph import Graph, Node
from ..nn.base import Layer


def trace_shape(layers: Sequence[Layer], input_shape: Sequence[int]) -> tuple[int, ...]:
    """Per-sample output shape of a chain of layers (for sizing the first fully connected layer)."""
    shape = (1,) + tuple(input_shape)
    for layer in layers:
        shape = layer.output_shape([shape])
    return tuple(shape[1:])


def flat(shape: Sequence[int]) -> int:
    return int(np.prod(shape))


def chain(g: Graph, node: Node, *layers: Layer) -> Node:
    """Add ``layers`` one after another starting from ``node``; return the last node."""
    for layer in layers:
        node = g.add(layer, node)
    return node
