"""``layerwise``: vDNN's layer-wise allocation with nothing offloaded (MXNet's static planner).

Every buffer is allocated just before its first use and released after its last; stashed feature maps
stay on the device until backward. It is vdnn-dyn's second step (the fastest algorithms without
offload) and the memory baseline that recomputation is measured against.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..device.spec import DeviceSpec
from ..graph import Program
from .base import Policy, register
from .plan import Plan, Stash

if TYPE_CHECKING:
    from .base import Oracle
    from ..costs.model import CostModel

__all__ = ["Layerwise"]


@register
@dataclass(frozen=True)
class Layerwise(Policy):
    """``layerwise[:algos=memory|performance]``."""

    name = "layerwise"
    budget_free = True  # its decisions are the same at every capacity

    def decide(
        self, program: Program, device: DeviceSpec, costs: "CostModel | None" = None, oracle: "Oracle | None" = None
    ) -> Plan:
        stashed = program.stashed_buffers()
        return self.new_plan(
            program,
            device,
            costs,
            stash={program.tensors[b].name: Stash.KEEP for b in sorted(stashed)},
            reason=f"layer-wise allocation; nothing offloaded ({len(stashed)} stashed buffers kept)",
        )
