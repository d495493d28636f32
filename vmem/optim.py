"""Optimizers: SGD (momentum, Nesterov, weight decay) and Adam, updating device arrays in place; the
dynamic loss scale of fp16 training (:class:`GradScaler`).

An optimizer declares the state it keeps per parameter (``slots``) so that the planner and the executor
can allocate it from the device pool (category ``optimizer_state``). ``update`` runs on the compute
stream, after backward, and may overwrite the gradient.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ._typing import Array
    from ._typing import Xp

__all__ = ["Optimizer", "SGD", "Adam", "GradScaler"]


class Optimizer(ABC):
    """Base class: ``slots`` names the per-parameter state; ``update`` applies one step in place."""

    slots: tuple[str, ...] = ()

    def __init__(self, lr: float):
        if not lr > 0:
            raise ValueError(f"{type(self).__name__}: lr={lr!r} must be positive")
        self.lr = float(lr)

    @abstractmethod
    def update(self, xp: Xp, param: Array, grad: Array, state: dict[str, Any], step: int) -> None:
        """Update ``param`` from ``grad``; ``step`` counts updates from 1."""

    def fused(self, step: int) -> tuple[str, tuple[Any, ...]] | None:
        """The fused kernel of this update (vmem/csrc/kernels.cuh) and its scalars at ``step``, rounded to
        FP32 as NumPy rounds them beside float32 arrays; None where there is none (the update then runs as
        :meth:`update`, and the executor reads the step's finite flag on the host)."""
        return None

    def config(self) -> dict[str, Any]:
        """Hyperparameters, stored in checkpoints."""
        return {"type": type(self).__name__, **{k: v for k, v in vars(self).items() if not k.startswith("_")}}


class SGD(Optimizer):
    """``SGD(lr, momentum=0, weight_decay=0, nesterov=False)``, as in PyTorch:
    g += wd * p; buf = momentum * buf + g; p -= lr * (g + momentum * buf if nesterov else buf)."""

    def __init__(self, lr: float = 0.01, momentum: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False):
        super().__init__(lr)
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"SGD: momentum={momentum!r} must be in [0, 1)")
        if weight_decay < 0:
            raise ValueError(f"SGD: weight_decay={weight_decay!r} must be >= 0")
        if nesterov and not momentum:
            raise ValueError("SGD: nesterov=True needs momentum > 0")
        self.momentum = float(momentum)
        self.weight_decay = float(weight_decay)
        self.nesterov = bool(nesterov)
        self.slots = ("momentum",) if momentum else ()

    def update(self, xp: Xp, param: Array, grad: Array, state: dict[str, Any], step: int) -> None:
        if self.weight_decay:
            grad += self.weight_decay * param
        if self.momentum:
            buf = state["momentum"]
            if step == 1:
                buf[...] = grad
            else:
                buf *= self.momentum
                buf += grad
            if self.nesterov:
                grad += self.momentum * buf
            else:
                grad = buf
        param -= self.lr * grad

    def fused(self, step: int) -> tuple[str, tuple[Any, ...]]:
        f32 = np.float32
        return "sgd_update", (
            f32(self.lr),
            f32(self.momentum),
            f32(self.weight_decay),
            np.int32(self.nesterov),
            np.int32(step == 1),
        )


class Adam(Optimizer):
    """``Adam(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0)`` with bias correction (L2 decay)."""

    slots = ("m", "v")

    def __init__(
        self, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0
    ):
        super().__init__(lr)
        b1, b2 = betas
        if not (0 <= b1 < 1 and 0 <= b2 < 1):
            raise ValueError(f"Adam: betas={betas!r} must be in [0, 1)")
        self.betas = (float(b1), float(b2))
        self.eps = float(eps)
        self.weight_decay = float(weight_decay)

    def update(self, xp: Xp, param: Array, grad: Array, state: dict[str, Any], step: int) -> None:
        b1, b2 = self.betas
        if self.weight_decay:
            grad += self.weight_decay * param
        m, v = state["m"], state["v"]
        m *= b1
        m += (1 - b1) * grad
        v *= b2
        v += (1 - b2) * grad * grad
        step_size = self.lr / (1 - b1**step)
        denom = xp.sqrt(v / (1 - b2**step))
        denom += self.eps
        param -= step_size * (m / denom)

    def fused(self, step: int) -> tuple[str, tuple[Any, ...]]:
        b1, b2 = self.betas
        f32 = np.float32
        return "adam_update", (
            f32(self.lr / (1 - b1**step)),
            f32(b1),
            f32(1 - b1),
            f32(b2),
            f32(1 - b2),
            f32(1 - b2**step),
            f32(self.eps),
            f32(self.weight_decay),
        )


class GradScaler:
    """The dynamic loss scale of fp16 training, with PyTorch's ``GradScaler`` semantics and defaults.

    A step's loss gradient is multiplied by :attr:`scale` (so that small gradients survive fp16), its
    weight gradients divided by it before the update; a step whose scaled gradients are not all finite is
    skipped (nothing changes) and the scale multiplied by ``backoff_factor``; after ``growth_interval``
    finite steps in a row it is multiplied by ``growth_factor`` (where the result is finite). The scale is a
    float32, each product rounded once to it, as PyTorch keeps it: the same sequence of scales for the same
    sequence of overflows. bf16 training needs no scaler (its range is float32's).
    """

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
    ):
        if not (np.isfinite(init_scale) and init_scale > 0):
            raise ValueError(f"GradScaler: init_scale={init_scale!r} must be a positive finite number")
        if not growth_factor > 1:
            raise ValueError(f"GradScaler: growth_factor={growth_factor!r} must be greater than 1")
        if not 0 < backoff_factor < 1:
            raise ValueError(f"GradScaler: backoff_factor={backoff_factor!r} must be in (0, 1)")
        if not (isinstance(growth_interval, int) and growth_interval >= 1):
            raise ValueError(f"GradScaler: growth_interval={growth_interval!r} must be a positive int")
        self._scale = np.float32(init_scale)
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = growth_interval
        self.growth_tracker = 0  # finite steps since the scale last changed
        self.skipped = 0  # steps skipped for overflow so far

    @property
    def scale(self) -> float:
        """The scale the next step's loss gradient is multiplied by."""
        return float(self._scale)

    def inverse(self) -> float:
        """What the gradients are multiplied by before the update: 1/scale, as a float32 (as PyTorch's)."""
        return float(np.float32(1.0 / float(self._scale)))

    def update(self, found_inf: bool) -> None:
        """After a step: back off (and count the skip) where its gradients overflowed, else grow the scale
        once every ``growth_interval`` finite steps."""
        if found_inf:
            self._scale = np.float32(float(self._scale) * self.backoff_factor)
            self.growth_tracker = 0
            self.skipped += 1
            return
        self.growth_tracker += 1
        if self.growth_tracker == self.growth_interval:
            grown = np.float32(float(self._scale) * self.growth_factor)
            if np.isfinite(grown):
                self._scale = grown
            self.growth_tracker = 0

    def state_dict(self) -> dict[str, Any]:
        """The scale and its counters (saved in checkpoints)."""
        return {"scale": float(self._scale), "growth_tracker": self.growth_tracker, "skipped": self.skipped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._scale = np.float32(state["scale"])
        self.growth_tracker = int(state["growth_tracker"])
        self.skipped = int(state.get("skipped", 0))

    def fused(self, step: int) -> tuple[str, tuple[Any, ...]] | None:
        """The fused kernel of this update (vmem/csrc/kernels.cuh) and its scalars at ``step``, rounded to
        FP32 as NumPy rounds them beside float32 arrays; None where there is none (the update then runs as
        :meth:`update`, and the executor reads the step's finite flag on the host)."""
        return None

    def config(self) -> dict[str, Any]:
        """Hyperparameters, stored in checkpoints."""
        return {
            "growth_factor": self.growth_factor,
            "backoff_factor": self.backoff_factor,
            "growth_interval": self.growth_interval,
        }

    def __repr__(self) -> str:
        return (
            f"GradScaler(scale={self.scale:g}, growth_factor={self.growth_factor:g}, "
            f"backoff_factor={self.backoff_factor:g}, growth_interval={self.growth_interval})"
        )
