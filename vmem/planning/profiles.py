"""Measured costs to plan with: a device's profile of a network at a batch, kept between runs.

Where a policy decides by time (``vdnn-dyn``, ``auto`` on a real device), a plan needs what the device
measures: every op, pass and algorithm at the batch, within the budget the plan is for. Profiles are kept
on disk (:mod:`vmem.costs.cache`: ``VMEM_CACHE_DIR``, ``VMEM_PROFILE_CACHE=0`` to measure afresh).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .. import policies
from ..costs import cache

if TYPE_CHECKING:
    from ..costs.measured import Profiled
    from ..device.base import Device
    from ..graph import Network
    from ..policies.base import Policy

__all__ = ["needs_profile", "measure", "cache_folder", "cache_enabled", "not_kept", "profile_line"]


def needs_profile(policy: Policy | str) -> bool:
    """Whether ``policy`` decides by measured time (on a real device it plans only with a profile)."""
    return bool(policies.get(policy).needs_profile)


def measure(net: Network, batch: int, device: Device, *, precision: str = "fp32") -> tuple[Profiled, bool]:
    """``net``'s profile at ``batch`` on ``device`` (its algorithms, within its pool's free memory): (the
    profile, whether it was kept from an earlier run)."""
    program = device.catalog(net.build(batch, precision=precision))
    return cache.profile(program, copy_gbps=device.spec.pcie_gbps, device=device)


def cache_folder() -> Path:
    """Where profiles are kept."""
    return cache.folder()


def cache_enabled() -> bool:
    """Whether profiles are kept and reused (``VMEM_PROFILE_CACHE`` is not ``0``)."""
    return cache.enabled()


def not_kept() -> str | None:
    """Why the profile measured last was not kept for the next run (None where it was)."""
    return cache.not_kept()


def profile_line(kept: bool, seconds: float) -> str:
    """Whether the run's profile came from the cache or was measured (and kept) now."""
    from ..units import printable

    where = printable(str(cache_folder()))
    if not cache_enabled():
        return f"profile: measured in {seconds:.1f} s (VMEM_PROFILE_CACHE=0: not kept)"
    if kept:
        return f"profile: the one kept in {where} (VMEM_PROFILE_CACHE=0 measures afresh)"
    why = not_kept()
    if why is not None:  # the next run measures again
        return f"profile: measured in {seconds:.1f} s, not kept ({why}): the next run measures it again"
    return f"profile: measured in {seconds:.1f} s and kept in {where} for the next run"
