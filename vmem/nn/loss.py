"""Loss functions. They sit after the network's output and start backward."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TYPE_CHECKING

import numpy as np

from ..errors import ShapeError
from .base import Shape

if TYPE_CHECKING:
    from .._typing import Array
    from .._typing import Xp

__all__ = ["SoftmaxCrossEntropy", "LossWork"]


@dataclass(frozen=True)
class LossWork:
    """The arrays a loss computes in instead of making temporaries (a step recorded as a CUDA graph then
    asks the array module for no memory): per row of the probabilities (``probs.shape[:-1]``), a column
    of their type (``rows``, (..., 1)) and a value (``picked``), the flat index of its label (``at``) and
    the offset of its row (``offsets``: row x classes, written once), and the loss (``value``, 0-d).
    :meth:`make` makes them on the device once, with the step's executor (a few bytes a row)."""

    rows: Array
    picked: Array
    at: Array
    offsets: Array
    value: Array

    @classmethod
    def make(cls, xp: Xp, probs_shape: tuple[int, ...], dtype: Any) -> "LossWork":
        lead, classes = tuple(probs_shape[:-1]), int(probs_shape[-1])
        count = int(np.prod(lead))
        return cls(
            rows=xp.empty(lead + (1,), dtype),
            picked=xp.empty(count, dtype),
            at=xp.empty(count, np.int64),
            offsets=xp.arange(count, dtype=np.int64) * classes,
            value=xp.empty((), dtype),
        )


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
        """The probabilities as rows, the labels flat, and which labels count (None: all); an ignored
        label (PyTorch's -100, say) is read as class 0 where it indexes, and counts for nothing."""
        p2 = probs.reshape(-1, probs.shape[-1])
        l1 = labels.reshape(-1)
        if self.ignore is None:
            return p2, l1, None
        keep = l1 != self.ignore
        return p2, xp.where(keep, l1, 0), keep

    def forward(self, xp: Xp, logits: Array, labels: Array, probs: Array, work: LossWork | None = None) -> Any:
        """The loss (0-d, on the device), the probabilities written into ``probs``; computed in ``work``'s
        arrays where given (else in ones made for the call)."""
        if probs is not logits:
            probs[...] = logits  # read into the loss's dtype (float32 over half-precision logits)
        w = work if work is not None else LossWork.make(xp, probs.shape, probs.dtype)
        xp.max(probs, axis=-1, keepdims=True, out=w.rows)
        xp.subtract(probs, w.rows, out=probs)
        xp.exp(probs, out=probs)
        xp.sum(probs, axis=-1, keepdims=True, out=w.rows)
        xp.divide(probs, w.rows, out=probs)
        _, l1, keep = self._flat(xp, probs, labels)
        xp.add(w.offsets, l1, out=w.at)  # each row's label, as a flat index
        xp.take(probs.reshape(-1), w.at, out=w.picked)
        xp.maximum(w.picked, xp.finfo(probs.dtype).tiny, out=w.picked)
        xp.log(w.picked, out=w.picked)
        xp.negative(w.picked, out=w.picked)
        if keep is None:
            return xp.mean(w.picked, out=w.value)
        return (w.picked * keep).sum() / max(int(keep.sum()), 1)  # (ignore: counted on the host)

    def backward(self, xp: Xp, probs: Array, labels: Array, dlogits: Array, work: LossWork | None = None) -> None:
        """d(loss)/d(logits) into ``dlogits`` (which may be ``probs``), computed in ``work``'s arrays where
        given (in ``dlogits``'s type; else in ones made for the call)."""
        p2, l1, keep = self._flat(xp, probs, labels)
        d2 = dlogits.reshape(-1, dlogits.shape[-1])
        if dlogits is not probs:  # the gradient may be written over the probabilities
            d2[...] = p2
        w = work if work is not None else LossWork.make(xp, probs.shape, dlogits.dtype)
        flat = d2.reshape(-1)
        xp.add(w.offsets, l1, out=w.at)
        xp.take(flat, w.at, out=w.picked)
        xp.subtract(w.picked, 1 if keep is None else keep, out=w.picked)  # an ignored row: nothing taken off
        xp.put(flat, w.at, w.picked)
        if keep is None:
            d2 /= len(l1)
        else:
            d2 *= (keep / max(int(keep.sum()), 1))[:, None]

    def __repr__(self) -> str:
        return "SoftmaxCrossEntropy()" if self.ignore is None else f"SoftmaxCrossEntropy(ignore={self.ignore})"
