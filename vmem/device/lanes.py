"""The CPU device's lanes: the layers' pieces of work (:mod:`vmem.nn.lanes`) run side by side on the
step's core budget (:mod:`vmem.threads`)."""

from __future__ import annotations

import threading
from typing import Callable

from .. import threads
from ..nn.lanes import LANES
from ..nn.ops import HostOps

__all__ = ["LaneOps"]

if LANES != threads.LANES:  # the pieces the layers cut and the threads that run them
    raise ImportError(f"vmem.nn.lanes.LANES={LANES} differs from vmem.threads.LANES={threads.LANES}")

_inside = threading.local()


class LaneOps(HostOps):
    """:class:`~vmem.nn.ops.HostOps` whose lanes run at once where the step's core budget has lanes
    (:meth:`vmem.threads.CoreBudget.limit`), else in turn; lanes do not nest (work inside a lane runs its
    own lanes in turn). The pieces, hence the results, are the same either way.

    ``budget`` is the device's core budget (the process's, :data:`vmem.threads.BUDGET`, unless the device
    was given its own) and ``helpers`` the pool that runs lanes past the first (:data:`vmem.threads.LANE`)."""

    def __init__(self, budget: threads.CoreBudget | None = None, helpers: threads.WorkerPool | None = None):
        self.budget = threads.BUDGET if budget is None else budget
        self.helpers = threads.LANE if helpers is None else helpers

    def run(self, work: Callable[[int], None], lanes: int = LANES) -> None:
        """``work(lane)`` for each lane: at once where the step has lanes, else in turn. The first error
        raised is re-raised after every lane has finished."""
        if lanes < 2 or self.budget.lanes < lanes or getattr(_inside, "on", False):
            for lane in range(lanes):
                work(lane)
            return

        def inside(lane: int) -> None:
            _inside.on = True
            try:
                work(lane)
            finally:
                _inside.on = False

        futures = [self.helpers.submit(inside, lane) for lane in range(1, lanes)]
        try:
            inside(0)
        finally:
            errors = [f.exception() for f in futures]
        for error in errors:
            if error is not None:
                raise error
