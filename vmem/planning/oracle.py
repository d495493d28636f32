"""The oracle a searching policy asks about its candidate plans (vdnn-dyn, echo, auto): the same lowering and
replay as a plan's own, made cheap where the answer cannot change."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable, TypeVar

from ..device.spec import DeviceSpec
from ..graph import Program
from ..policies.plan import Plan
from ..schedule import Schedule
from ..schedule.lower import lower
from ..schedule.replay import Figures
from .result import PlanResult, placement, replay_fitting, replay_if_fits

if TYPE_CHECKING:
    from ..costs.model import CostModel

__all__ = ["Oracle", "Replays"]

_T = TypeVar("_T")


class _Placed:
    """One placement of a plan: the capacities ``[lo, hi)`` it is made for, its top and live bytes, and its
    figures once replayed at a capacity holding the top (None until then)."""

    __slots__ = ("lo", "hi", "top", "live", "figures")

    def __init__(self, lo: int, hi: float, top: int, live: int, figures: Figures | None):
        self.lo, self.hi, self.top, self.live, self.figures = lo, hi, top, live, figures


class Oracle:
    """Answers ``oracle(candidate, memory=None, packing="auto", unfit=True)`` for ``program`` (as the device
    sees it) on ``device``: the candidate lowered and replayed at ``memory`` (the device's where not given),
    its blocks placed (``packing``: see :func:`~vmem.planning.result.evaluate`) only as tightly as they need
    to be to fit it (the greedy orders run only where the sweeps' placement does not fit and the live
    bytes do; the planner's own figures place them as tightly as they can; a plan that sends sign bits to
    the host, a last resort, ``"thorough"``ly). With ``unfit=False``, None
    where it does not fit (a planner that keeps only plans that fit needs no figures of the others: no
    second replay for them). The same plan asked again at another ``memory`` (a search for its least
    budget) is replayed, not lowered again, where it would be placed the same; with ``replays``
    (:class:`Replays`, which a plan makes for its oracle and a curve shares among its budgets' oracles), a
    plan asked again where its answer is known is neither lowered nor replayed."""

    def __init__(
        self,
        program: Program,
        device: DeviceSpec,
        *,
        alignment: int = 256,
        optimizer_slots: tuple[str, ...] = ("momentum",),
        costs: "CostModel | None" = None,
        accumulate: bool = False,
        replays: "Replays | None" = None,
    ):
        self.program, self.device, self.alignment = program, device, alignment
        self.accumulate = accumulate  # the candidates as micro-batches after the first (their gradients added)
        self.optimizer_slots, self.costs = optimizer_slots, costs
        #: the plan last lowered (kept, so that its id is not reused), its packing and its schedule
        self._last: tuple[Plan, str, Schedule] | None = None
        #: answers shared with the oracles of this program at other capacities (:class:`Replays`)
        self.replays = replays
        self.scope = replays.scope_of(self) if replays is not None else ()

    def __call__(
        self, candidate: Plan, memory: int | None = None, packing: str = "auto", unfit: bool = True
    ) -> PlanResult | None:
        spec = self.device if memory is None else dataclasses.replace(self.device, memory=memory)
        packing = placement(candidate, packing)
        key = (candidate.decisions(), packing) if self.replays is not None else None
        if key is not None:
            known = self.replays.answer(self.scope, key, spec.memory, unfit)  # type: ignore[union-attr]
            if known is not None:
                figures = known[0]
                return None if figures is None else PlanResult(candidate, figures)
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
            figures = replay_fitting(schedule, spec, self.alignment, self.costs)
        else:
            figures = replay_if_fits(schedule, spec, self.alignment, self.costs)
        if key is not None:
            self.replays.learn(self.scope, key, schedule, spec.memory, figures)  # type: ignore[union-attr]
        return None if figures is None else PlanResult(candidate, figures)

    def once(self, key: tuple, make: Callable[[], _T]) -> _T:
        """``make()``, for what is the same at every capacity (a budget-free policy's decisions, the baseline's
        time): found once for every oracle sharing this one's :class:`Replays`, each time without."""
        return make() if self.replays is None else self.replays.once(self.scope, key, make)


class Replays:
    """What oracles learnt of the plans they replayed, kept for the oracles of the same program at other
    capacities (a curve's budgets: the same starts, moves and descents are asked again at each). Per plan
    (its decisions and packing), each placement the lowering made: the capacities it is made for, its
    arena's top, its live bytes and, once replayed at a capacity holding the top, its figures. At any such
    capacity every block takes its planned place, so the replay is the same (tests hold this over the zoo's
    curves); below the live bytes no placement fits. A plan asked again where the answer is known is neither
    lowered nor replayed. Only a program, device (its capacity apart), alignment, optimizer, cost model and
    accumulation alike share answers (:meth:`scope_of`)."""

    def __init__(self) -> None:
        #: scope -> (decisions, packing) -> the placements made of that plan
        self._known: dict[tuple, dict[tuple, list[_Placed]]] = {}
        self._held: list[object] = []  # the cost models scopes name by id, kept alive
        #: scope -> values found once for every capacity (:meth:`once`: the baseline's step time)
        self._once: dict[tuple, dict[tuple, object]] = {}
        self.hits = 0
        self.misses = 0

    def scope_of(self, oracle: "Oracle") -> tuple:
        """What answers depend on besides a plan and a capacity."""
        program, costs = oracle.program, oracle.costs
        if costs is not None and all(c is not costs for c in self._held):
            self._held.append(costs)
        return (
            program.network,
            program.batch,
            program.precision.name,
            tuple((op.name, op.kind) for op in program.ops),
            tuple(t.nbytes for t in program.tensors),  # the same network in another dtype is another program
            dataclasses.replace(oracle.device, memory=0),
            oracle.alignment,
            oracle.optimizer_slots,
            oracle.accumulate,
            id(costs),
        )

    def once(self, scope: tuple, key: tuple, make: Callable[[], _T]) -> _T:
        """``make()``, found once per scope and key: for what is the same at every capacity."""
        known = self._once.setdefault(scope, {})
        if key not in known:
            known[key] = make()
        return known[key]  # type: ignore[return-value]

    def answer(self, scope: tuple, key: tuple, memory: int, unfit: bool) -> tuple[Figures | None] | None:
        """The oracle's answer for the plan ``key`` at ``memory``, as a 1-tuple (its figures, or None where it
        does not fit and ``unfit`` is False), or None where it is not known."""
        for placed in self._known.get(scope, {}).get(key, ()):
            if not placed.lo <= memory < placed.hi:
                continue
            figures = placed.figures
            if figures is not None and placed.top <= memory:
                self.hits += 1
                return (figures,)
            if placed.live > memory:  # no placement fits: the figures of any (unfit), or none
                if not unfit:
                    self.hits += 1
                    return (None,)
                if figures is not None:
                    self.hits += 1
                    return (dataclasses.replace(figures, fits=False),)
        self.misses += 1
        return None

    def learn(self, scope: tuple, key: tuple, schedule: Schedule, memory: int, figures: Figures | None) -> None:
        """Keep what replaying ``schedule`` (lowered for ``memory``) showed: its placement, and its figures where
        every block took its planned place (a capacity holding the top, or none)."""
        if schedule.placed_for is None or schedule.placed_top is None or schedule.live_bytes is None:
            return
        lo, hi = schedule.placed_for
        top = schedule.placed_top
        same = figures is not None and (top <= memory or not figures.fits)  # not placed elsewhere by the pool
        kept = dataclasses.replace(figures, fits=True) if same and figures is not None else None
        placements = self._known.setdefault(scope, {}).setdefault(key, [])
        for placed in placements:
            if placed.lo == lo and placed.hi == hi:
                placed.figures = placed.figures if placed.figures is not None else kept
                return
        placements.append(_Placed(lo, hi, top, schedule.live_bytes, kept))
