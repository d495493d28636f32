"""The training step's own kernels (vmem/csrc/kernels.cuh), beside the layers' and the codecs' of
:mod:`.native`: the batch's input made channels last on the device, the step's finite check over every
gradient, and the optimizer's fused update, whose scalars it reads from device memory."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .native import CPU, Backend, _bits, _i64, _suffix

if TYPE_CHECKING:
    from .._typing import Array

__all__ = ["UPDATE_SCALARS", "finite_multi", "nchw_to_nhwc", "optimizer_update", "update_scalars"]


def nchw_to_nhwc(x: Array, y: Array, on: Backend = CPU) -> None:
    """``y = x.transpose(0, 2, 3, 1)`` cast to ``y``'s type (float32, float16, bfloat16) by one kernel: ``x``
    a C-contiguous float32 (N, C, H, W) map, ``y`` a C-contiguous (N, H, W, C) one."""
    n, c, h, w = x.shape
    if tuple(y.shape) != (n, h, w, c) or np.dtype(x.dtype) != np.float32:
        raise ValueError(f"nchw_to_nhwc: a float32 (N, C, H, W) map into (N, H, W, C), not {x.shape} into {y.shape}")
    rows = n * h * w
    on.launch(f"nchw_to_nhwc_{_suffix(y)}", rows, x, _bits(y), _i64(rows), _i64(c), _i64(h * w), cols=c)


def finite_multi(ptrs: Array, offsets: Array, total: int, ok: Array, on: Backend = CPU) -> None:
    """Clear ``ok[0]`` (one byte) where any value of the float32 tensors at addresses ``ptrs`` (uint64) is
    not finite; ``offsets`` (int64, one longer): where each starts in their concatenation, ``total`` (their
    values together, as the host knows it) last. One launch for every tensor (the step's finite check)."""
    on.launch("finite_multi", total, ptrs, offsets, _i64(ptrs.size), ok)


_NO_SLOT = np.zeros(1, np.float32)  # the momentum buffer of SGD without momentum: never read or written


def optimizer_update(
    kernel: str, param: Array, grad: Array, slots: list[Array], ok: Array, scalars: Array, on: Backend = CPU
) -> None:
    """One fused optimizer update (``kernel``: ``sgd_update`` or ``adam_update``, with the scalars of
    :meth:`vmem.optim.Optimizer.fused` as a float32 array where the kernel runs: :func:`update_scalars`) of
    float32 ``param`` in place, its gradient and its state arrays ``slots``, where the device flag ``ok`` (a
    bool array of one value) is true."""
    if kernel == "sgd_update" and not slots:
        slots = [on.xp.asarray(_NO_SLOT)]
    on.launch(kernel, param.size, param, grad, *slots, ok, _i64(param.size), scalars)


#: how many scalars a fused update reads (sgd_update five, adam_update eight)
UPDATE_SCALARS = 8


def update_scalars(scalars: tuple, out: np.ndarray) -> np.ndarray:
    """The scalars of :meth:`vmem.optim.Optimizer.fused` written into ``out`` (float32, at least
    :data:`UPDATE_SCALARS` values: the host's side of what the kernel reads), each as its kernel takes it."""
    out[: len(scalars)] = [np.float32(v) for v in scalars]
    out[len(scalars) :] = 0
    return out
