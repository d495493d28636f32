"""What a refusal says: the error for a step that does not fit, with its remedy (the smallest budget the policy
trains in, the policies that fit, the largest batch that does)."""

from __future__ import annotations

from typing import Any, TYPE_CHECKING

from .. import policies
from ..errors import OutOfDeviceMemory, PlanError
from ..graph import Program
from ..units import format_bytes
from .budget import smallest_memory
from .plan import plan_program
from .result import PlanResult
from .target import Target

if TYPE_CHECKING:
    from ..policies.base import Policy

__all__ = ["batch_advice", "refusal", "out_of_memory"]


def batch_advice(largest: int | None, capacity: int) -> str:
    """The remedy a batch that does not fit gets: the ``largest`` batch that does in ``capacity`` bytes (None:
    not even batch 1)."""
    if largest is None:
        return f"not even batch 1 fits in {format_bytes(capacity)}: give the device more memory"
    return f"the largest batch that fits in {format_bytes(capacity)} is {largest}"


def out_of_memory(pool: Any, peak: int, by_category: dict[str, int], remedy: str) -> OutOfDeviceMemory:
    """The error for a step of ``peak`` bytes that does not fit ``pool`` (said before anything runs)."""
    stats = pool.stats()
    return OutOfDeviceMemory(
        peak, pool.capacity, stats.in_use, stats.largest_free, stats.fragmentation, by_category, remedy=remedy
    )


def refusal(
    program: Program,
    plan: PlanResult,
    target: Target,
    policy: Policy,
    optimizer_slots: tuple[str, ...],
    pool: Any,
    batch_remedy: str,
) -> OutOfDeviceMemory:
    """The error for ``plan`` (``policy``'s for ``program``), which does not fit ``target``: what it needs (the
    smallest budget the policy trains in, else its peak), the other policies that fit, and ``batch_remedy``
    (:func:`batch_advice`)."""
    least = smallest_memory(program, target, policy, optimizer_slots=optimizer_slots)
    fitting = []
    for name in policies.names():
        if name == policy.name:
            continue
        try:
            other, _ = plan_program(program, target, name, optimizer_slots=optimizer_slots)
        except PlanError:
            continue
        if other.fits:
            fitting.append(f"{name} (peak {format_bytes(other.peak_bytes)})")
    needs = (
        f"at least {format_bytes(least)} ({least} bytes, the smallest budget it fits in)"
        if least
        else format_bytes(plan.peak_bytes)
    )
    remedy = (
        f"policy {plan.policy} needs {needs} at batch {plan.batch}; "
        + (f"these policies fit: {', '.join(fitting)}; " if fitting else "")
        + batch_remedy
    )
    return out_of_memory(pool, plan.peak_bytes, {k: int(v["peak"]) for k, v in plan.by_category.items()}, remedy)
