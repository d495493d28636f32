"""The oracle a searching policy asks about its candidate plans (vdnn-dyn, echo, auto): the same lowering and
replay as a plan's own, made cheap where the answer cannot change."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from ..device.spec import DeviceSpec
from ..graph import Program
from ..policies.plan import Plan
from ..schedule import Schedule
from ..schedule.lower import lower
from .result import PlanResult, placement, replay_fitting, replay_if_fits

if TYPE_CHECKING:
    from ..costs.model import CostModel

__all__ = ["Oracle"]


class Oracle:
    """Answers ``oracle(candidate, memory=None, packing="auto", unfit=True)`` for ``program`` (as the device
    sees it) on ``device``: the candidate lowered and replayed at ``memory`` (the device's where not given),
    its blocks placed (``packing``: see :func:`~vmem.planning.result.evaluate`) only as tightly as they need
    to be to fit it (the greedy orders run only where the sweeps' placement does not fit and the live
    bytes do; the planner's own figures place them as tightly as they can; a plan that sends sign bits to
    the host, a last resort, ``"thorough"``ly). With ``unfit=False``, None
    where it does not fit (a planner that keeps only plans that fit needs no figures of the others: no
    second replay for them). The same plan asked again at another ``memory`` (a search for its least
    budget) is replayed, not lowered again, where it would be placed the same."""

    def __init__(
        self,
        program: Program,
        device: DeviceSpec,
        *,
        alignment: int = 256,
        optimizer_slots: tuple[str, ...] = ("momentum",),
        costs: "CostModel | None" = None,
        accumulate: bool = False,
    ):
        self.program, self.device, self.alignment = program, device, alignment
        self.accumulate = accumulate  # the candidates as micro-batches after the first (their gradients added)
        self.optimizer_slots, self.costs = optimizer_slots, costs
        #: the plan last lowered (kept, so that its id is not reused), its packing and its schedule
        self._last: tuple[Plan, str, Schedule] | None = None

    def __call__(
        self, candidate: Plan, memory: int | None = None, packing: str = "auto", unfit: bool = True
    ) -> PlanResult | None:
        spec = self.device if memory is None else dataclasses.replace(self.device, memory=memory)
        packing = placement(candidate, packing)
        last = self._last
        if (
            last is not None
            and last[0] is candidate
            and last[1] == packing
            and last[2].placed_for is not None
            and last[2].placed_for[0] <= spec.memory < last[2].placed_for[1]
        ):
            schedule = last[2]
        else:  # not the plan last lowered, or not placed as it would be for this capacity
            schedule = lower(
                self.program,
                candidate,
                self.optimizer_slots,
                self.alignment,
                packing,
                spec.memory,
                accumulate=self.accumulate,
            )
            self._last = (candidate, packing, schedule)
        if unfit:
            return PlanResult(candidate, replay_fitting(schedule, spec, self.alignment, self.costs))
        figures = replay_if_fits(schedule, spec, self.alignment, self.costs)
        return None if figures is None else PlanResult(candidate, figures)
