"""Parameters tied across layers (``Network.tie``): each op's parameters that are another op's, checked and
marked on the ops of a Program as it is built (``OpInfo.ties``, read through ``OpInfo.param_key``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from ..errors import ShapeError

if TYPE_CHECKING:
    from .program import OpInfo

__all__ = ["apply_ties"]


def apply_ties(network: str, ops: list[OpInfo], ties: Mapping[str, str]) -> None:
    """Mark each op's parameters that ``ties`` makes another's (``"layer.param"`` -> ``"owner.param"``),
    checked: both exist, the owner's is not tied itself, the shapes are one and both train or neither."""
    if not ties:
        return
    specs = {f"{op.name}.{k}": s for op in ops if op.shares is None for k, s in op.params.items()}
    for param, to in ties.items():
        for key in (param, to):
            if key not in specs:
                raise ShapeError(f"{network}: tie({param!r}, {to!r}): no parameter {key!r} in the network")
        if to in ties:
            raise ShapeError(f"{network}: tie({param!r}, {to!r}): {to!r} is tied to {ties[to]!r}; tie to that")
        a, b = specs[param], specs[to]
        if tuple(a.shape) != tuple(b.shape) or a.trainable != b.trainable:
            raise ShapeError(
                f"{network}: tie({param!r}, {to!r}): shapes {tuple(a.shape)} and {tuple(b.shape)}"
                + ("" if a.trainable == b.trainable else ", one trained and one not")
            )
    for op in ops:
        op.ties.update({k: ties[f"{op.param_owner}.{k}"] for k in op.params if f"{op.param_owner}.{k}" in ties})
