"""``auto``'s exhaustive search, on small graphs: every way of storing the stashed buffers replayed."""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, Any

from ...device.spec import DeviceSpec
from ...errors import PlanError
from ...graph import Program
from ..plan import Allocation, Plan
from .estimates import _applied, _Info, _refreshed

if TYPE_CHECKING:
    from ..base import Oracle
    from .policy import Auto

__all__ = ["search"]


def search(auto: "Auto", program: Program, device: DeviceSpec, oracle: "Oracle", plan: Plan, info: _Info) -> Any:
    """Where the buffers' choices from ``plan`` (layer-wise, fastest algorithms) make at most
    :attr:`EXHAUSTIVE` plans: the fastest of them that fits, every one replayed (None if none fits, or
    there are more)."""
    if plan.allocation != Allocation.LAYER:
        return None
    options = auto.choices(program, info.costs, plan, info)
    if math.prod(len(v) for v in options.values()) > auto.EXHAUSTIVE:
        return None
    best = None
    for combo in itertools.product(*options.values()):
        try:
            candidate = _refreshed(program, _applied(plan, [c for c in combo if c is not None]))
            # each offload held until its copy ends, and released at once: the faster that fits
            results = [
                oracle(tried) for tried in ((info.held(candidate), candidate) if candidate.prefetch else (candidate,))
            ]
        except (PlanError, ValueError):  # a mix the lowering cannot schedule
            continue
        for result in results:
            if result.fits and (best is None or result.step_seconds < best.step_seconds):
                best = result
    return best
