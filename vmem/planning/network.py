"""``vmem.plan``: one training step of a network at a batch, planned under a policy for a device (the program
built, the policy's decisions replayed; where the whole batch fits under none of its plans and the policy lets
it, as micro-batches: :mod:`.microbatch`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

from ..device.spec import DeviceSpec
from ..errors import BudgetTooSmall
from ..graph import Network, Program
from ..schedule import Schedule
from .microbatch import MicroPlan, plan_microbatched
from .oracle import Replays
from .plan import baseline_seconds, plan_program
from .result import PlanResult
from .target import Target
from ..units import format_bytes

if TYPE_CHECKING:
    from ..costs.model import CostModel
    from ..device.base import Device
    from ..policies.base import Policy

__all__ = ["plan", "plan_step", "PlannedStep"]


def plan(
    net: Network,
    batch: int,
    device: Device | DeviceSpec | Target | str = "cpu",
    policy: Policy | str = "baseline",
    *,
    input_shape: Sequence[int] | None = None,
    dtype: str = "float32",
    precision: str = "fp32",
    optimizer_slots: tuple[str, ...] = ("momentum",),
    memory: int | str | None = None,
    costs: "CostModel | None" = None,
    nproc: int = 1,
    shard_optimizer: bool = False,
    oversubscribe: bool = False,
) -> PlanResult:
    """Plan one training step of ``net`` at ``batch`` on ``device`` under ``policy``, without running it.

    ``device`` is a Device, a DeviceSpec or a name (``"cpu"``, ``"sim:titan-x"``; ``memory=`` overrides
    its capacity). On a simulated GPU the plan predicts step time with the roofline cost model; on the
    CPU device, pass ``costs`` (a profile, see :meth:`vmem.Trainer.profile`) to predict time.
    ``optimizer_slots`` names the optimizer state per parameter (SGD with momentum: one). ``precision``
    (``"fp32"``, ``"fp16"``, ``"bf16"``) is what feature maps are stored in (:mod:`vmem.precision`).
    A batch that fits under none of the policy's plans runs as micro-batches where the policy lets it
    (``microbatch=on``, auto's default; :mod:`vmem.planning.microbatch`): ``plan.microbatch`` says how many.
    ``nproc``: one rank of a data-parallel run of that many, each at ``batch`` (its share), the gradients'
    all-reduce over the device's interconnect priced and overlapped with backward (the figures'
    ``comm_seconds`` and ``exposed_comm_seconds``); ``shard_optimizer``: the optimizer's state sharded over
    the ranks (ZeRO's stage 1), the rank that keeps the most of it planned. ``memory`` above a simulated
    GPU's capacity is refused (as ``vmem plan`` refuses it) unless ``oversubscribe``: a what-if card.
    """
    if not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc={nproc!r} must be a positive int")
    card = Target.of(device)
    target = Target.of(card, memory)
    if memory is not None and not oversubscribe:
        card_spec = card.spec
        if card_spec.kind == "sim" and target.spec.memory > card_spec.memory:
            raise ValueError(
                f"memory={memory!r} is more than {card_spec.name}'s {format_bytes(card_spec.memory)}; give at most that, or "
                "oversubscribe=True to plan a card with that much memory"
            )
    return plan_step(
        lambda n: net.build(n, input_shape, dtype, precision),
        batch,
        target,
        policy,
        optimizer_slots=optimizer_slots,
        costs=costs,
        nproc=nproc,
        shard_optimizer=shard_optimizer,
    ).result


@dataclass(frozen=True)
class PlannedStep:
    """A training step as :func:`plan_step` planned it: the plan with its figures, and either the whole
    batch's ``schedule`` or its ``micro``-batches (:class:`~vmem.planning.microbatch.MicroPlan`)."""

    result: PlanResult
    schedule: Schedule | None = None
    micro: MicroPlan | None = None


def plan_step(
    build: Callable[[int], Program],
    batch: int,
    target: Target,
    policy: Policy | str,
    *,
    optimizer_slots: tuple[str, ...] = ("momentum",),
    costs: "CostModel | None" = None,
    nproc: int = 1,
    shard_optimizer: bool = False,
    micro: bool = True,
    replays: Replays | None = None,
) -> PlannedStep:
    """The one planning entry (``vmem.plan``, the curve and a Trainer's session call it): the step of
    ``batch`` samples (``build(n)``: the program at ``n``) planned whole under ``policy`` for ``target``; where
    it fits under none of the policy's plans and ``micro`` (one process) lets it, as micro-batches where the
    policy runs them (:func:`~vmem.planning.microbatch.plan_microbatched`), their figures carrying the whole
    batch's baseline step. A whole plan that does not fit is returned as it is (the caller refuses it, or
    reads its figures); BudgetTooSmall where the policy refuses the whole batch and no micro-batches fit.
    ``replays``: what planning the whole batch at other capacities learnt (a curve's budgets share it)."""
    program = build(batch)
    refused: BudgetTooSmall | None = None
    try:
        result, schedule = plan_program(
            program,
            target,
            policy,
            optimizer_slots=optimizer_slots,
            costs=costs,
            baseline=True,
            nproc=nproc,
            shard_optimizer=shard_optimizer,
            replays=replays,
        )
    except BudgetTooSmall as exc:  # nothing the policy chooses fits the whole batch
        refused = exc
    if (refused is not None or not result.fits) and micro and nproc == 1:
        # as micro-batches of the batch, one after the other (Plan.microbatch), where the policy lets it
        parts = plan_microbatched(build, batch, target, policy, optimizer_slots=optimizer_slots, costs=costs)
        if parts is not None:
            timed = target.costs(costs)
            base = None
            if timed is not None:  # the whole batch's baseline, as a plan that fits carries it
                viewed = target.view(program)
                base = baseline_seconds(viewed, target.spec, target.alignment, optimizer_slots, timed)
            figures = dataclasses.replace(parts.result.figures, baseline_step_seconds=base)
            return PlannedStep(PlanResult(parts.result.plan, figures), micro=parts)
    if refused is not None:
        raise refused
    return PlannedStep(result, schedule)
