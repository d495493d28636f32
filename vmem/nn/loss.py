"""Loss functions. They sit after the network's output and start backward."""

from __future__ import annotations

from typing import Any

from ..errors import ShapeError
from .base import Shape

__all__ = ["SoftmaxCrossEntropy"]


class SoftmaxCrossEntropy:
    """Mean cross-entropy of softmax(logits) against integer labels.

    ``forward`` writes the probabilities (saved for backward) and returns the loss as a 0-d array on the
    device; ``backward`` writes d(loss)/d(logits) = (p - onehot(labels)) / N.
    """

    name = "loss"

    def check(self, logits_shape: Shape) -> None:
        if len(logits_shape) != 2:
            raise ShapeError(
                f"loss SoftmaxCrossEntropy: expects (N, classes) logits, got shape {tuple(logits_shape)}; "
                "add a Flatten and a Linear layer before the loss"
            )

    def forward(self, xp: Any, logits: Any, labels: Any, probs: Any) -> Any:
        n = logits.shape[0]
        xp.subtract(logits, logits.max(axis=1, keepdims=True), out=probs)
        xp.exp(probs, out=probs)
        probs /= probs.sum(axis=1, keepdims=True)
        picked = probs[xp.arange(n), labels]
        return -xp.log(xp.maximum(picked, xp.finfo(probs.dtype).tiny)).mean()

    def backward(self, xp: Any, probs: Any, labels: Any, dlogits: Any) -> None:
        n = probs.shape[0]
        dlogits[...] = probs
        dlogits[xp.arange(n), labels] -= 1
        dlogits /= n

    def __repr__(self) -> str:
        return "SoftmaxCrossEntropy()"
