"""Errors raised by vmem. Each carries the facts needed to act on it as attributes."""

from __future__ import annotations

from typing import Mapping

from .units import format_bytes

__all__ = [
    "VmemError",
    "MemoryExhausted",
    "OutOfDeviceMemory",
    "OutOfPinnedMemory",
    "ShapeError",
    "CheckpointError",
    "NonFiniteError",
    "PlanError",
    "DoesNotFit",
    "BudgetTooSmall",
    "DeviceError",
    "OnnxError",
    "DistributedError",
]


class VmemError(Exception):
    """Base class of vmem's own errors."""


def _memory_report(
    what: str,
    requested: int,
    capacity: int,
    in_use: int,
    largest_free: int,
    fragmentation: float,
    pending: int,
    by_category: Mapping[str, int],
    remedy: str | None,
) -> str:
    holders = ", ".join(
        f"{cat} {format_bytes(n)}" for cat, n in sorted(by_category.items(), key=lambda kv: -kv[1]) if n
    )
    lines = [
        f"{what}: tried to allocate {format_bytes(requested)} ({requested} bytes); "
        f"capacity {format_bytes(capacity)}, in use {format_bytes(in_use)}, "
        f"free {format_bytes(capacity - in_use)} of which the largest block is {format_bytes(largest_free)} "
        f"(fragmentation {fragmentation:.1%})"
        + (f", {format_bytes(pending)} waiting on stream events" if pending else "")
        + ".",
        f"Held by category: {holders or 'nothing'}.",
    ]
    if remedy:
        lines.append(f"Remedy: {remedy}")
    return "\n".join(lines)


class MemoryExhausted(VmemError, MemoryError):
    """A fixed-capacity pool could not satisfy a request. The pool is unchanged by the failed request.

    Attributes: ``requested`` (bytes, after alignment), ``capacity``, ``in_use``, ``largest_free``,
    ``fragmentation`` (1 - largest free block / total free), ``pending`` (free bytes still waiting on a
    stream event), ``by_category`` (bytes in use per category) and ``remedy`` (a suggestion, or None).
    """

    _what = "Out of memory"

    def __init__(
        self,
        requested: int,
        capacity: int,
        in_use: int,
        largest_free: int,
        fragmentation: float,
        by_category: Mapping[str, int],
        *,
        pending: int = 0,
        remedy: str | None = None,
    ):
        self.requested = requested
        self.capacity = capacity
        self.in_use = in_use
        self.largest_free = largest_free
        self.fragmentation = fragmentation
        self.pending = pending
        self.by_category = dict(by_category)
        self.remedy = remedy
        super().__init__(
            _memory_report(
                self._what,
                requested,
                capacity,
                in_use,
                largest_free,
                fragmentation,
                pending,
                by_category,
                remedy,
            )
        )

    def __reduce__(self):  # keep the attributes when pickled (e.g. across processes)
        return (
            _rebuild,
            (
                type(self),
                self.requested,
                self.capacity,
                self.in_use,
                self.largest_free,
                self.fragmentation,
                self.by_category,
                self.pending,
                self.remedy,
            ),
        )


def _rebuild(cls, requested, capacity, in_use, largest_free, fragmentation, by_category, pending, remedy):
    return cls(requested, capacity, in_use, largest_free, fragmentation, by_category, pending=pending, remedy=remedy)


class OutOfDeviceMemory(MemoryExhausted):
    """The device pool cannot satisfy a request; the pool is unchanged (see :class:`MemoryExhausted`)."""

    _what = "Out of device memory"


class OutOfPinnedMemory(MemoryExhausted):
    """The pinned host pool reserved for offload is exhausted (its capacity is fixed up front)."""

    _what = "Out of pinned host memory"


class ShapeError(VmemError, ValueError):
    """A layer received a tensor of the wrong shape. The message names the layer and both shapes."""


class NonFiniteError(VmemError, FloatingPointError):
    """Training stopped: several steps in a row had a loss or gradients that were not finite (each changed
    nothing). The message names the first op whose output was not finite, and the step."""


class CheckpointError(VmemError):
    """A checkpoint could not be read or does not match the model; the model is left untouched."""


class PlanError(VmemError, ValueError):
    """No plan satisfies the request (for example, the network cannot fit the memory budget), or a plan is
    invalid (a recompute source that is not live when it is needed)."""


class DoesNotFit(PlanError):
    """The step does not fit the device's memory under any choice of the policy (a larger budget or a smaller
    batch would): the one refusal that means "too large", as a search for the largest batch reads it."""


class BudgetTooSmall(DoesNotFit):
    """The device's memory is below the least the network needs at this batch under any choice of the
    policy; ``least`` is that least budget in bytes (to the pool's alignment)."""

    def __init__(self, message: str, least: int):
        super().__init__(message)
        self.least = least


class DeviceError(VmemError, ValueError):
    """A device name or option is not valid, or the device is not available on this machine."""


class OnnxError(VmemError, ValueError):
    """An ONNX model that vmem cannot import (an op, attribute or opset it does not support: every such node
    is named, with the supported list), or a network it cannot export (a layer with no ONNX form). Raised
    before anything is built or written."""


class DistributedError(VmemError, RuntimeError):
    """A collective of several processes (:mod:`vmem.distributed`) failed: another rank stopped, hangs, or
    the transport reported an error. The message names this rank and the collective."""
