"""Loss functions. They sit after the network's output and start backward."""

from __future__ import annotations

from typing import Any, TYPE_CHECKING

from ..errors import ShapeError
from .base import Shape

if TYPE_CHECKING:
    from .._typing import Array
    from .._typing import Xp

__all__ = ["SoftmaxCrossEntropy"]


class SoftmaxCrossEntropy:
    """Mean cross-entropy of softmax(logits) against integer labels.

    Logits are (N, classes), or (N, T, classes) for a sequence with labels (N, T): one prediction per token.
    ``ignore``: a label that counts for nothing (padding); the mean is over the other labels.
    ``forward`` writes the probabilities (saved for backward) and returns the loss as a 0-d array on the
    device; ``backward`` writes d(loss)/d(logits) = (p - onehot(labels)) / count. Either may write over its
    input: ``probs`` may be ``logits``, ``dlogits`` may be ``probs``. ``probs`` may be wider than the
    logits (float32 over half-precision logits, as AMP computes softmax and losses).
    """

    name = "loss"

    def __init__(self, ignore: int | None = None):
        self.ignore = ignore

    def check(self, logits_shape: Shape) -> None:
        if len(logits_shape) not in (2, 3):
            raise ShapeError(
                f"loss SoftmaxCrossEntropy: expects (N, classes) or (N, T, classes) logits, got shape "
                f"{tuple(logits_shape)}; a classifier must end in them (add Flatten and Linear layers), or "
                "train with a loss that takes this output"
            )

    def _flat(self, xp: Xp, probs: Array, labels: Array) -> tuple[Any, Any, Any]:
        p2 = probs.reshape(-1, probs.shape[-1])
        l1 = labels.reshape(-1)
        keep = None if self.ignore is None else (l1 != self.ignore)
        return p2, l1, keep

    def forward(self, xp: Xp, logits: Array, labels: Array, probs: Array) -> Any:
        if probs is not logits:
            probs[...] = logits  # read into the loss's dtype (float32 over half-precision logits)
        probs -= probs.max(axis=-1, keepdims=True)
        xp.exp(probs, out=probs)
        probs /= probs.sum(axis=-1, keepdims=True)
        p2, l1, keep = self._flat(xp, probs, labels)
        nll = -xp.log(xp.maximum(p2[xp.arange(len(l1)), l1], xp.finfo(probs.dtype).tiny))
        if keep is None:
            return nll.mean()
        return (nll * keep).sum() / max(int(keep.sum()), 1)

    def backward(self, xp: Xp, probs: Array, labels: Array, dlogits: Array) -> None:
        p2, l1, keep = self._flat(xp, probs, labels)
        d2 = dlogits.reshape(-1, dlogits.shape[-1])
        if dlogits is not probs:  # the gradient may be written over the probabilities
            d2[...] = p2
        d2[xp.arange(len(l1)), l1] -= 1
        if keep is None:
            d2 /= len(l1)
        else:
            d2 *= (keep / max(int(keep.sum()), 1))[:, None]

    def __repr__(self) -> str:
        return "SoftmaxCrossEntropy()" if self.ignore is None else f"SoftmaxCrossEntropy(ignore={self.ignore})"
