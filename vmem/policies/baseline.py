"""The baseline: network-wide allocation as in Torch and Caffe, the reference vDNN compares against.

Every feature map lives for the whole iteration; ReLU runs in place; only the gradient maps still needed
are live (for a chain, a dX/dY pair reused layer by layer); one workspace is sized to the largest need.
All of it is allocated up front, so the peak and the average usage are equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..device.spec import DeviceSpec
from ..graph import Program
from .base import Policy, register
from .plan import Allocation, Plan, Stash

if TYPE_CHECKING:
    from .base import Oracle
    from ..costs.model import CostModel


@register
@dataclass(frozen=True)
class Baseline(Policy):
    """``baseline[:algos=memory|performance]``."""

    name = "baseline"
    budget_free = True  # its decisions are the same at every capacity

    def decide(
        self, program: Program, device: DeviceSpec, costs: "CostModel | None" = None, oracle: "Oracle | None" = None
    ) -> Plan:
        return self.new_plan(
            program,
            device,
            costs,
            allocation=Allocation.NETWORK,
            stash={t.name: Stash.KEEP for t in program.tensors if t.stashed},
            reason="network-wide allocation: every feature map is kept for the whole iteration",
        )
