"""Devices: the CPU device now; the simulated GPUs (``sim:<gpu>``) and CUDA (``cuda:<n>``) share its protocol."""

from __future__ import annotations

import sys
import types
from typing import Any

from ..errors import DeviceError
from . import specs
from .base import Device, DeviceSpec
from .cpu import CpuDevice
from .sim import SimDevice

__all__ = ["device", "names", "Device", "DeviceSpec", "CpuDevice", "SimDevice", "specs"]


def names() -> list[str]:
    """Device names :func:`device` accepts on this machine."""
    return ["cpu"] + [f"sim:{n}" for n in specs.names()]


def device(name: str | Device = "cpu", **options: Any) -> Device:
    """Create a device by name: ``vmem.device("cpu", memory="512MiB", pcie_gbps=None, poison=False)``.

    A :class:`Device` passed in is returned as it is (options are then not allowed).
    """
    if not isinstance(name, str):
        if isinstance(name, Device):
            if options:
                raise DeviceError(f"options {sorted(options)} apply only when a device is created by name")
            return name
        raise DeviceError(f"device={name!r}: expected a device name such as 'cpu', or a Device")
    if name in ("cpu", "cpu:0"):
        try:
            return CpuDevice(**options)
        except TypeError as exc:  # an unknown keyword: name it and list the valid ones
            raise DeviceError(
                f"device 'cpu': {exc}; options are memory, pcie_gbps, poison, pinned_memory, alignment"
            ) from None
    kind, _, rest = name.partition(":")
    if kind == "sim":
        try:
            return SimDevice(rest, **options)
        except TypeError as exc:
            raise DeviceError(f"device {name!r}: {exc}; options are memory, alignment") from None
        except ValueError as exc:
            raise DeviceError(f"device {name!r}: {exc}") from None
    if kind == "cuda":
        raise DeviceError(f"device {name!r}: the CUDA device is not available in this version of vmem; use 'cpu'")
    raise DeviceError(f"unknown device {name!r}; available: {', '.join(names())}")


class _CallableModule(types.ModuleType):
    """``vmem.device`` is both this package and the factory: ``vmem.device("cpu")`` calls :func:`device`,
    ``vmem.device.specs`` is the spec-sheet module."""

    def __call__(self, name: "str | Device" = "cpu", **options: Any) -> Device:
        return device(name, **options)


sys.modules[__name__].__class__ = _CallableModule
