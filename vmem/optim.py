"""Optimizers: SGD (momentum, Nesterov, weight decay) and Adam, updating device arrays in place.

An optimizer declares the state it keeps per parameter (``slots``) so that the planner and the executor
can allocate it from the device pool (category ``optimizer_state``). ``update`` runs on the compute
stream, after backward, and may overwrite the gradient.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

__all__ = ["Optimizer", "SGD", "Adam"]


class Optimizer(ABC):
    """Base class: ``slots`` names the per-parameter state; ``update`` applies one step in place."""

    slots: tuple[str, ...] = ()

    def __init__(self, lr: float):
        if not lr > 0:
            raise ValueError(f"{type(self).__name__}: lr={lr!r} must be positive")
        self.lr = float(lr)

    @abstractmethod
    def update(self, xp: Any, param: Any, grad: Any, state: dict[str, Any], step: int) -> None:
        """Update ``param`` from ``grad``; ``step`` counts updates from 1."""

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

    def update(self, xp: Any, param: Any, grad: Any, state: dict[str, Any], step: int) -> None:
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

    def update(self, xp: Any, param: Any, grad: Any, state: dict[str, Any], step: int) -> None:
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
