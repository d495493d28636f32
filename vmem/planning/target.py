"""What a plan is made for, read once from a Device, a DeviceSpec or a device name: a :class:`Target`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from ..device.spec import DeviceSpec
from ..graph import Program

if TYPE_CHECKING:
    from ..device.base import Device
    from ..costs.model import CostModel

__all__ = ["Target"]


@dataclass(frozen=True)
class Target:
    """The device a plan is made for: its ``spec`` (the capacity a plan must fit), the pool's ``alignment``
    and its convolution ``catalog`` (a Device's ``catalog``: the program as the device sees it, its
    algorithms and their workspace; None for a bare DeviceSpec: a simulated GPU's cuDNN as the simulator
    models it, no algorithms elsewhere). Made once (:meth:`of`) and handed to every plan, so that the
    catalog is applied in one place (:meth:`view`)."""

    spec: DeviceSpec
    alignment: int = 256
    catalog: Callable[[Program], Program] | None = None

    @classmethod
    def of(cls, device: Device | DeviceSpec | Target | str, memory: int | str | None = None) -> "Target":
        """The target of a Device, a DeviceSpec, a Target or a device name (``"cpu"``, ``"sim:titan-x"``),
        its capacity ``memory`` where given (a size or a string such as ``"8GiB"``)."""
        from ..device import device as make_device
        from ..units import parse_bytes

        if isinstance(device, Target):
            target = device
        elif isinstance(device, DeviceSpec):
            target = cls(device)
        elif isinstance(device, str):
            if device in ("cpu", "cpu:0"):  # no need to start a CPU device's streams just to plan
                from ..device.staging import cpu_catalog

                target = cls(DeviceSpec(name="cpu", kind="cpu", memory=1 << 30), 256, cpu_catalog)
            else:  # sim:<gpu>; names that are not available raise a clear DeviceError
                target = cls(make_device(device).spec)
        else:
            target = cls(device.spec, device.pool.alignment, device.catalog)
        return target if memory is None else target.with_memory(parse_bytes(memory, name="memory"))

    def with_memory(self, memory: int) -> "Target":
        """The same device with a capacity of ``memory`` bytes."""
        return dataclasses.replace(self, spec=dataclasses.replace(self.spec, memory=int(memory)))

    def view(self, program: Program) -> Program:
        """``program`` as the device sees it: its convolution catalog (``catalog``; on a simulated GPU without
        one, cuDNN's as the simulator models it for the spec's architecture)."""
        if self.catalog is not None:
            return self.catalog(program)
        if self.spec.kind == "sim":
            from ..costs import with_cudnn_catalog

            return with_cudnn_catalog(program, self.spec.arch)
        return program

    def costs(self, costs: "CostModel | None" = None) -> Any:
        """The cost model plans are priced with: ``costs`` where given (a profile), else on a simulated GPU
        the roofline of its spec (none elsewhere: plans then give memory, not time)."""
        if costs is not None or self.spec.kind != "sim":
            return costs
        from ..costs import Roofline

        return Roofline(self.spec)
