"""Weights, weight gradients and optimizer state, held in the device pool for a whole run."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..schedule import Buffer, Key, Kind

__all__ = ["DeviceParams"]


class DeviceParams:
    """The persistent buffers of a Schedule, allocated in the device pool and viewed by key; weights are
    uploaded from and downloaded to host arrays named ``"layer.param"``."""

    def __init__(self, device: Any, buffers: list[Buffer], specs: dict[str, Any], dtype: str):
        self.device = device
        self.dtype = np.dtype(dtype)
        self.blocks: dict[Key, Any] = {}
        self.views: dict[Key, Any] = {}
        try:
            for buf in buffers:
                block = device.pool.allocate(buf.nbytes, None, buf.category)
                self.blocks[buf.key] = block
                self.views[buf.key] = device.view(block, specs[buf.key.name].shape, self.dtype)
        except BaseException:
            self.release()
            raise
        for key, view in self.views.items():
            if key.kind is not Kind.WEIGHT:
                view.fill(0)

    def _host(self, view: Any) -> np.ndarray:
        """A host copy of a device view (CuPy arrays copy to the host with ``get``)."""
        return np.array(view) if self.device.xp is np else view.get()

    def upload(self, params: dict[str, np.ndarray]) -> None:
        xp = self.device.xp
        for name, value in params.items():
            self.views[Key(Kind.WEIGHT, name)][...] = xp.asarray(value)

    def download(self) -> dict[str, np.ndarray]:
        return {k.name: self._host(v) for k, v in self.views.items() if k.kind is Kind.WEIGHT}

    def optimizer_state(self) -> dict[str, np.ndarray]:
        """``"layer.param:slot"`` -> a host copy of that optimizer state."""
        return {f"{k.name}:{k.part}": self._host(v) for k, v in self.views.items() if k.kind is Kind.OPT_STATE}

    def load_optimizer_state(self, state: dict[str, np.ndarray]) -> None:
        xp = self.device.xp
        for name, value in state.items():
            param, _, slot = name.rpartition(":")
            self.views[Key(Kind.OPT_STATE, param, slot)][...] = xp.asarray(value)

    def release(self) -> None:
        for block in self.blocks.values():
            self.device.pool.free(block)
        self.blocks.clear()
        self.views.clear()
