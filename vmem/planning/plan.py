"""``vmem.plan``: decide with a policy, lower to a schedule, and replay it on a simulated device (see
:mod:`.result`); for one rank of a data-parallel run, the gradients' all-reduce and the sharded optimizer
state added to the schedule."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from .. import policies
from ..device.spec import DeviceSpec
from ..graph import Program
from ..policies.base import decide, fit_algorithms
from ..schedule import Schedule
from ..schedule.collectives import largest_share, with_allreduce, with_sharded_optimizer
from .oracle import Oracle, Replays
from .result import PlanResult, evaluate, replay_fitting
from .target import Target

if TYPE_CHECKING:
    from ..policies.base import Policy
    from ..costs.model import CostModel

__all__ = ["plan_program", "rank_plan", "floor_policy", "needs_budget", "baseline_seconds"]


def needs_budget(policy: Policy | str) -> bool:
    """Whether ``policy`` is made for a budget (it trades time for memory only as far as a capacity asks:
    ``auto``, ``vdnn-dyn``), so that a run without ``memory`` gives it one (``--memory auto``)."""
    return bool(policies.get(policy).needs_budget)


def floor_policy(policy: Policy | str) -> Policy:
    """The policy whose plan is the least ``policy`` can need: its ``floor`` where it chooses among others
    (``vdnn-dyn`` and ``auto``: vdnn-all with memory-optimal algorithms, for ``auto`` a bound), else itself
    (with ``algos=fit``, its least-workspace algorithms)."""
    pol = policies.get(policy)
    if pol.floor is not None:
        return policies.get(pol.floor)
    return policies.get(pol, algos="memory") if pol.algos == "fit" else pol


def plan_program(
    program: Program,
    device: DeviceSpec | Target,
    policy: Policy | str,
    *,
    alignment: int = 256,
    optimizer_slots: tuple[str, ...] = ("momentum",),
    costs: "CostModel | None" = None,
    baseline: bool = False,
    catalog: Any = None,
    nproc: int = 1,
    shard_optimizer: bool = False,
    accumulate: bool = False,
    update: bool = True,
    replays: Replays | None = None,
) -> tuple[PlanResult, Schedule]:
    """Decide, lower and replay for a built Program; the plan with its figures, and the Schedule.

    ``device``: a :class:`~vmem.planning.target.Target` (the Session's, made once), or a DeviceSpec with its
    pool's ``alignment`` and its ``catalog`` (a Device's ``catalog``, which gives the program the device's
    convolution algorithms). With ``baseline=True`` (and a cost model) the figures also carry the step time
    of ``baseline`` with the fastest algorithms, as an oracle when it does not fit. ``nproc`` > 1: one rank
    of a data-parallel run of that many (the program at the rank's batch): the gradients all-reduced in
    buckets during backward (:func:`vmem.schedule.collectives.with_allreduce`), their time over the spec's
    interconnect in the figures (``comm_seconds``, ``exposed_comm_seconds``); with ``shard_optimizer``, the
    optimizer's state sharded over the ranks (:func:`vmem.schedule.collectives.with_sharded_optimizer`),
    planned for the rank that keeps the most of it. ``replays``: what planning this program at other
    capacities learnt (:class:`~vmem.planning.oracle.Replays`, a curve's), shared with this plan's oracle."""
    target = device if isinstance(device, Target) else Target(device, alignment, catalog)
    pol = policies.get(policy)
    spec, alignment = target.spec, target.alignment
    disturbed = bool(getattr(costs, "disturbed", False))  # a profile taken while other processes used the cores
    busy = getattr(costs, "busy_elsewhere", None)
    program, costs = target.view(program), target.costs(costs)
    oracle = Oracle(
        program,
        spec,
        alignment=alignment,
        optimizer_slots=optimizer_slots,
        costs=costs,
        accumulate=accumulate,
        replays=replays if replays is not None else Replays(),  # a plan asked again is not replayed again
    )
    decided = fit_algorithms(pol, program, spec, costs, oracle, decide(pol, program, spec, costs, oracle))
    decided = dataclasses.replace(decided, math=spec.math)  # the device's FP32 math, recorded with the plan
    if disturbed:  # the plan says what its times came from
        from ..costs.measured import disturbed_note

        decided = dataclasses.replace(decided, notes={**decided.notes, "profile": disturbed_note(busy)})
    result, schedule = evaluate(
        program,
        spec,
        decided,
        alignment=alignment,
        optimizer_slots=optimizer_slots,
        costs=costs,
        accumulate=accumulate,
        update=update,
    )
    if nproc > 1:
        rank = largest_share(program, nproc) if shard_optimizer else None
        result, schedule = rank_plan(result, schedule, spec, alignment, costs, nproc, rank)
    if baseline and costs is not None:
        figures = dataclasses.replace(
            result.figures,
            baseline_step_seconds=baseline_seconds(program, spec, alignment, optimizer_slots, costs, oracle),
        )
        result = PlanResult(decided, figures)
    return result, schedule


def baseline_seconds(
    program: Program,
    spec: DeviceSpec,
    alignment: int,
    optimizer_slots: tuple[str, ...],
    costs: "CostModel",
    oracle: Oracle | None = None,
) -> float | None:
    """The step time of ``baseline`` with the fastest algorithms (``program`` as the device sees it): the
    oracle a plan's time is read against, fitting or not. Its blocks placed as tightly as they go, its time
    is the same at every capacity: where ``oracle`` shares :class:`Replays`, found once for them all."""
    base = policies.get("baseline:algos=performance").decide(program, spec, costs)

    def seconds() -> float | None:
        return evaluate(
            program, spec, base, alignment=alignment, optimizer_slots=optimizer_slots, costs=costs, rows=False
        )[0].step_seconds

    return seconds() if oracle is None else oracle.once(("baseline", base.decisions()), seconds)


def rank_plan(
    result: PlanResult,
    schedule: Schedule,
    device: DeviceSpec,
    alignment: int,
    costs: "CostModel | None",
    world: int,
    shard_rank: int | None = None,
) -> tuple[PlanResult, Schedule]:
    """``result`` and ``schedule`` (one process's) as one rank of a data-parallel run of ``world`` runs them:
    the gradients all-reduced in buckets during backward, with ``shard_rank`` the optimizer's state sharded
    over the ranks (that rank's share kept), replayed for the rank's figures (the per-layer rows and the
    baseline's time kept)."""
    schedule = with_allreduce(schedule, world)
    if shard_rank is not None:
        schedule = with_sharded_optimizer(schedule, shard_rank)
    figures = replay_fitting(schedule, device, alignment, costs)
    kept = result.figures
    figures = dataclasses.replace(figures, layers=kept.layers, baseline_step_seconds=kept.baseline_step_seconds)
    return PlanResult(result.plan, figures), schedule
