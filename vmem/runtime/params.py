"""Weights, weight gradients and optimizer state, held in the device pool for a whole run.

Every write and read goes through the device's compute stream, in order with the steps that use them:
uploads are host-to-device copies enqueued there (from pageable host memory: the host waits for them, and
on a GPU nothing is staged through CuPy's pinned pool), zero-fills are launched there, and downloads are
device-to-host copies enqueued there. Nothing runs on a GPU's legacy default stream, which a non-blocking
compute stream does not wait for."""

from __future__ import annotations

from typing import Any, TYPE_CHECKING

import numpy as np

from ..graph.program import Precision
from ..schedule import Buffer, Key, Kind

if TYPE_CHECKING:
    from ..device.base import Device

__all__ = ["DeviceParams"]


class DeviceParams:
    """The persistent buffers of a Schedule, allocated in the device pool and viewed by key; weights are
    uploaded from and downloaded to host arrays named ``"layer.param"``. ``precision``: what weights,
    their gradients and the optimizer's state are stored in (a Precision, or one dtype for all)."""

    def __init__(self, device: Device, buffers: list[Buffer], specs: dict[str, Any], precision: Any):
        self.device = device
        self.precision = Precision.uniform(precision) if isinstance(precision, str) else precision
        role = {Kind.WEIGHT: "parameters", Kind.WEIGHT_GRAD: "gradients", Kind.OPT_STATE: "optimizer_state"}
        self.blocks: dict[Key, Any] = {}
        self.views: dict[Key, Any] = {}
        try:
            for buf in buffers:
                block = device.pool.allocate(buf.nbytes, None, buf.category)
                self.blocks[buf.key] = block
                dtype = np.dtype(getattr(self.precision, role[buf.key.kind]))
                self.views[buf.key] = device.view(block, specs[buf.key.name].shape, dtype)
        except BaseException:
            self.release()
            raise
        stream = device.compute_stream
        for key, view in self.views.items():
            if key.kind is not Kind.WEIGHT:
                stream.launch(view.fill, 0)

    def _host(self, view: Any) -> np.ndarray:
        """A host copy of a device view, copied on the compute stream after the work enqueued there (into
        pageable memory: the host waits for the copy)."""
        out = np.empty(view.shape, view.dtype)
        self.device.copy_to_host(out, view, self.device.compute_stream)
        return out

    def _write(self, view: Any, value: Any, name: str) -> None:
        """Copy the host array ``value`` into ``view`` on the compute stream (a pageable copy: the host waits
        for it, so the caller may change ``value`` afterwards)."""
        host = np.ascontiguousarray(value, dtype=view.dtype)
        if host.shape != view.shape:
            raise ValueError(f"{name}: shape {host.shape}, the device holds {view.shape}")
        self.device.copy_to_device(view, host, self.device.compute_stream)

    def upload(self, params: dict[str, np.ndarray]) -> None:
        for name, value in params.items():
            self._write(self.views[Key(Kind.WEIGHT, name)], value, name)

    def download(self) -> dict[str, np.ndarray]:
        return {k.name: self._host(v) for k, v in self.views.items() if k.kind is Kind.WEIGHT}

    def optimizer_state(self) -> dict[str, np.ndarray]:
        """``"layer.param:slot"`` -> a host copy of that optimizer state."""
        return {f"{k.name}:{k.part}": self._host(v) for k, v in self.views.items() if k.kind is Kind.OPT_STATE}

    def optimizer_keys(self) -> set[str]:
        """The ``"layer.param:slot"`` names of the optimizer state held here."""
        return {f"{k.name}:{k.part}" for k in self.views if k.kind is Kind.OPT_STATE}

    def load_optimizer_state(self, state: dict[str, np.ndarray]) -> None:
        for name, value in state.items():
            param, _, slot = name.rpartition(":")
            self._write(self.views[Key(Kind.OPT_STATE, param, slot)], value, name)

    def release(self) -> None:
        for block in self.blocks.values():
            self.device.pool.free(block)
        self.blocks.clear()
        self.views.clear()
