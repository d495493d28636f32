"""Devices behind one protocol: the CPU device, simulated GPUs (``sim:<gpu>``) and CUDA GPUs (``cuda:<n>``).

``vmem.device("cpu", memory="512MiB")`` makes one. The device classes are imported when first asked for,
so that :class:`DeviceSpec` (``vmem.device.spec``) and the spec sheets can be read without the pool or
the streams.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

from ..errors import DeviceError
from .spec import DeviceSpec

if TYPE_CHECKING:
    from .base import Device

__all__ = ["device", "names", "Device", "DeviceSpec", "CpuDevice", "SimDevice", "specs"]

_LAZY = {
    "Device": ("base", "Device"),
    "CpuDevice": ("cpu", "CpuDevice"),
    "SimDevice": ("sim", "SimDevice"),
    "specs": ("specs", None),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = _LAZY[name]
    mod = importlib.import_module(f"{__name__}.{module}")
    return mod if attr is None else getattr(mod, attr)


def names() -> list[str]:
    """Device names :func:`device` accepts on this machine."""
    from . import specs

    return ["cpu"] + [f"sim:{n}" for n in specs.names()]


def device(name: Any = "cpu", **options: Any) -> Device:
    """Create a device by name: ``vmem.device("cpu", memory="512MiB", pcie_gbps=None, poison=False)``.

    A :class:`Device` passed in is returned as it is (options are then not allowed).
    """
    from .base import Device
    from .cpu import CpuDevice
    from .sim import SimDevice

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
                f"device 'cpu': {exc}; options are memory, pcie_gbps, poison, pinned_memory, alignment, math"
            ) from None
    kind, _, rest = name.partition(":")
    if kind == "sim":
        try:
            return SimDevice(rest, **options)
        except TypeError as exc:
            raise DeviceError(f"device {name!r}: {exc}; options are memory, alignment, math") from None
        except ValueError as exc:
            raise DeviceError(f"device {name!r}: {exc}") from None
    if kind == "cuda":
        from .cuda import open_device

        return open_device(name, rest, **options)
    raise DeviceError(f"unknown device {name!r}; available: {', '.join(names())}")


class _CallableModule(types.ModuleType):
    """``vmem.device`` is both this package and the factory: ``vmem.device("cpu")`` calls :func:`device`,
    ``vmem.device.specs`` is the spec-sheet module."""

    def __call__(self, name: Any = "cpu", **options: Any) -> Device:
        return device(name, **options)


sys.modules[__name__].__class__ = _CallableModule
