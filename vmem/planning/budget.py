"""Budgets: the smallest memory a policy trains a program in, and the largest batch a policy plans to fit a
device."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence, TYPE_CHECKING

from ..device.spec import DeviceSpec
from ..errors import DoesNotFit
from ..graph import Network, Program
from ..policies.budget import largest_fitting, least_memory
from .oracle import Oracle
from .network import plan
from .plan import floor_policy, plan_program
from .result import UNBOUNDED, evaluate, replay_if_fits
from .target import Target

if TYPE_CHECKING:
    from ..device.base import Device
    from ..policies.base import Policy

__all__ = ["smallest_memory", "largest_batch", "fraction_budget"]


def smallest_memory(
    program: Program,
    device: DeviceSpec | Target,
    policy: Policy | str,
    *,
    alignment: int = 256,
    optimizer_slots: tuple[str, ...] = ("momentum",),
    catalog: Any = None,
) -> int | None:
    """The smallest device capacity (to ``alignment``) in which ``policy`` trains ``program``: its plan's
    blocks as they are packed, with the device's algorithms (``catalog``). For ``vdnn-dyn``, the least
    any of its choices needs: vdnn-all with memory-optimal algorithms. None above 4x the plan's peak."""
    target = device if isinstance(device, Target) else Target(device, alignment, catalog)
    device, alignment = target.spec, target.alignment
    pol = floor_policy(policy)
    unbounded = dataclasses.replace(device, memory=UNBOUNDED)
    program = target.view(program)

    oracle = Oracle(program, unbounded, alignment=alignment, optimizer_slots=optimizer_slots)
    decided = pol.decide(program, unbounded, None, oracle)
    # lowered once: the same schedule at every capacity, replayed at each
    result, schedule = evaluate(
        program, unbounded, decided, alignment=alignment, optimizer_slots=optimizer_slots, rows=False
    )
    peak = result.peak_bytes
    return least_memory(
        lambda memory: replay_if_fits(schedule, dataclasses.replace(device, memory=memory), alignment) is not None,
        peak,
        alignment,
    )


def largest_batch(
    net: Network,
    device: Device | DeviceSpec | Target | str = "cpu",
    *,
    memory: int | str | None = None,
    policy: Policy | str = "auto",
    precision: str = "fp32",
    input_shape: Sequence[int] | None = None,
    dtype: str = "float32",
    optimizer_slots: tuple[str, ...] = ("momentum",),
    most: int = 1 << 16,
    progress: Any = None,
    costs: Callable[[int], Any] | None = None,
) -> int:
    """The largest batch (up to ``most``) whose training step ``policy`` plans to fit ``device`` (its
    capacity ``memory`` where given), with feature maps in ``precision``: 0 where not even batch 1 fits.
    Found by doubling from 1 and then bisecting, one plan a try (a plan that fits at a batch is assumed to
    fit at every smaller one). ``progress(batch, fits)`` is called after each try. The whole step's batch:
    a policy that runs micro-batches (``microbatch=on``, auto's default) trains any larger batch as
    micro-batches of at most this many (:mod:`vmem.planning.microbatch`).

    ``costs(batch)``: the cost model each try plans with (a profile of the device at that batch:
    :func:`vmem.planning.profiles.measure`), as a policy that ranks plans by time needs on a real device
    (``auto``, ``vdnn-dyn``; a simulated GPU has its own). Only "does not fit" (:class:`DoesNotFit`) counts
    as a try that failed: any other refusal is raised."""
    if isinstance(most, bool) or not isinstance(most, int) or most < 1:
        raise ValueError(f"largest_batch: most={most!r} must be a positive int")
    target = Target.of(device, memory)

    def fits(batch: int) -> bool:
        program = net.build(batch, input_shape, dtype, precision)
        try:
            result, _ = plan_program(
                program,
                target,
                policy,
                optimizer_slots=optimizer_slots,
                costs=None if costs is None else costs(batch),
            )
            ok = bool(result.fits)
        except DoesNotFit:  # nothing the policy can choose fits
            ok = False
        if progress is not None:
            progress(batch, ok)
        return ok

    return largest_fitting(fits, most)


def fraction_budget(
    net: Network,
    batch: int,
    device: Device | DeviceSpec | Target | str,
    policy: Policy | str,
    fraction: float,
    *,
    precision: str = "fp32",
) -> tuple[int, int, bool]:
    """A budget of ``fraction`` of what the baseline policy needs to train ``net`` at ``batch`` on ``device``
    (with its least-workspace algorithms: the least it needs), rounded up to KiB; never below the smallest
    budget ``policy`` trains in, where it is raised to that (``vmem train --memory auto:FRACTION``). Returns
    (the budget, the baseline's peak, whether the budget was raised)."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction={fraction!r}: a budget is a fraction of the baseline's peak in (0, 1]")
    target = Target.of(device)
    lean = plan(net, batch, target, "baseline:algos=memory", memory=UNBOUNDED, precision=precision, oversubscribe=True)
    needs = lean.peak_bytes
    floor = smallest_memory(net.build(batch, precision=precision), target, policy)
    memory = -(-int(needs * fraction) // 1024) * 1024
    if floor is not None and memory < floor:
        return floor, needs, True
    return memory, needs, False
