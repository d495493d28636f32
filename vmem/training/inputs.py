"""What a Trainer checks of a batch before it runs (the inputs' shapes against the network's, the labels
against its output: one integer class a sample, or a token; their counts alike) and what it makes of the
outputs of an evaluation (mean loss and accuracy)."""

from __future__ import annotations

from typing import Any, Sequence, TYPE_CHECKING, cast

import numpy as np

from ..codecs.base import is_device_array
from ..errors import ShapeError
from ..graph import Network

if TYPE_CHECKING:
    from .._typing import Array
    from ..device.base import Device

__all__ = ["batch_arrays", "count", "check_labels", "host_labels", "loss_and_accuracy", "on_device"]


def batch_arrays(net: Network, input_shape: Sequence[int], x: Array) -> Any:
    """The batch as the executor takes it: an array, or for a network of several inputs a list of arrays
    (one per input, in the order of ``net.inputs``), each checked against its input's shape."""
    shapes = net.input_shapes(input_shape)
    names = [node.name for node in net.inputs]
    if len(shapes) == 1:
        arrays = [_array(x)]
    elif not isinstance(x, (tuple, list)) or len(x) != len(shapes):
        raise ShapeError(
            f"{net.name}: takes {len(shapes)} inputs ({', '.join(names)}): give a tuple of arrays, one "
            "per input in that order"
        )
    else:
        arrays = [_array(a) for a in x]
    for a, shape, name in zip(arrays, shapes, names):
        if tuple(a.shape[1:]) != tuple(shape):
            what = "input batch" if len(shapes) == 1 else f"input {name!r}"
            raise ShapeError(
                f"{net.name}: {what} has shape {tuple(a.shape)}, the network takes (N, {', '.join(map(str, shape))})"
            )
    if any(len(a) != len(arrays[0]) for a in arrays):
        raise ShapeError(f"{net.name}: its inputs hold {[len(a) for a in arrays]} samples; give each alike")
    return arrays[0] if len(arrays) == 1 else arrays


def _array(a: object) -> Array:
    """A host batch as a NumPy array; a device array (``Device.device_array``'s) as it is."""
    return a if is_device_array(a) else np.asarray(a)


def on_device(device: Device, x: Array) -> Array:
    """``x`` (an array or a tuple of them) with each array of ``device`` as the device takes it (a GPU's
    CuPy array, another library's through ``__cuda_array_interface__`` or DLPack); host arrays as they are."""
    if isinstance(x, (tuple, list)):
        return type(x)(on_device(device, a) for a in x)
    made = device.device_array(x)
    return x if made is None else made


def host_labels(device: Device, y: Array) -> Array:
    """Labels on the host (read from ``device`` where they are its array: they are checked there)."""
    made = device.device_array(y)
    return y if made is None else cast(Any, made).get()


def count(x: Array) -> int:
    """Samples in a batch as :func:`batch_arrays` gives it."""
    return len(x[0]) if isinstance(x, list) else len(x)


def check_labels(net: Network, input_shape: Sequence[int], loss: Any, y: Array, n: int) -> None:
    """``y`` holds ``n`` labels the network's output and ``loss`` take: integer classes in range, one a
    sample (or a token, for a network predicting sequences)."""
    if len(y) != n:
        raise ShapeError(f"{net.name}: {n} inputs but {len(y)} labels")
    if not len(y):
        return
    y = np.asarray(y)
    out = net.output_shape(1, input_shape)
    if hasattr(loss, "check"):  # the output is one the loss takes (logits, for cross-entropy)
        loss.check(out)
    classes = out[-1]
    if tuple(y.shape[1:]) != tuple(out[1:-1]):
        raise ShapeError(
            f"{net.name}: labels have shape {tuple(y.shape)}, the network predicts "
            f"(N, {', '.join(map(str, out[1:-1] + (classes,)))}): one label per "
            + ("token" if len(out) > 2 else "sample")
        )
    if y.dtype.kind not in "iu" or y.min() < 0 or y.max() >= classes:
        raise ValueError(
            f"{net.name}: labels must be integers from 0 to {classes - 1} (the network has {classes} classes); "
            f"got {y.dtype} from {y.min()} to {y.max()}"
        )


def loss_and_accuracy(logits: np.ndarray, labels: np.ndarray, ignore: int | None = None) -> dict[str, float]:
    """Mean cross-entropy and accuracy (a fraction) of ``logits`` (N, ..., classes) against ``labels`` (N,
    ...), in float64, leaving out the labels equal to ``ignore``."""
    logits = logits.astype(np.float64).reshape(-1, logits.shape[-1])  # sequences: one prediction per token
    labels = np.asarray(labels).reshape(-1)
    keep = np.ones(len(labels), bool) if ignore is None else labels != ignore
    logits -= logits.max(axis=1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    loss = float(-logp[np.arange(len(labels)), labels][keep].mean())
    accuracy = float((logits.argmax(axis=1) == labels)[keep].mean())
    return {"loss": loss, "accuracy": accuracy}
