"""A decided plan lowered and replayed: its figures (:class:`PlanResult`), the replay on a simulated device of
the target's capacity (through the same pool code the executor uses, so the peak includes alignment and
fragmentation exactly; a plan that does not fit is replayed again without a capacity, ``fits=False``), and
what :func:`validate` finds wrong with a plan."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..device.sim import SimDevice
from ..device.spec import DeviceSpec
from ..errors import DoesNotFit, OutOfDeviceMemory, PlanError
from ..graph import PASSES, Program
from ..policies.plan import Plan
from ..schedule import Schedule
from ..schedule.lower import lower, op_workspace
from ..schedule.replay import Figures, LayerRow, durations, replay
from ..units import format_bytes

if TYPE_CHECKING:
    from ..costs.model import CostModel

__all__ = [
    "UNBOUNDED",
    "PlanResult",
    "evaluate",
    "placement",
    "replay_if_fits",
    "replay_fitting",
    "Problem",
    "validate",
]

#: A capacity no plan reaches: a plan that does not fit is replayed at it for its figures.
UNBOUNDED = 1 << 60


@dataclass(frozen=True)
class PlanResult:
    """A policy's decisions (``plan``, frozen) and what they cost (``figures``, from a replay).

    Attributes of either read through: ``result.peak_bytes``, ``result.fits``, ``result.stash``,
    ``result.reason``."""

    plan: Plan
    figures: Figures

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        for part in (self.plan, self.figures):
            if hasattr(part, name):
                return getattr(part, name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r} (neither the plan nor its figures)")

    def to_dict(self) -> dict[str, Any]:
        """Decisions and figures in one plain object (what ``vmem plan --json`` prints)."""
        return {**self.plan.to_dict(), **self.figures.to_dict()}

    def table(self) -> str:
        """A per-layer table: output shape, algorithms, stash decision, bytes (see vmem.report)."""
        from .report import layer_table

        return layer_table(self)


def placement(plan: Plan, packing: str) -> str:
    """How ``plan``'s blocks are placed where ``packing`` is asked: a plan that sends sign bits to the host
    (auto's last resort) ``"thorough"``ly where ``"auto"`` is (:func:`vmem.schedule.pack.pack`)."""
    return "thorough" if plan.signs and packing == "auto" else packing


def evaluate(
    program: Program,
    device: DeviceSpec,
    decided: Plan,
    *,
    alignment: int = 256,
    optimizer_slots: tuple[str, ...] = ("momentum",),
    costs: "CostModel | None" = None,
    packing: str = "auto",
    rows: bool = True,
    accumulate: bool = False,
    update: bool = True,
) -> tuple[PlanResult, Schedule]:
    """Lower a decided plan and replay it (``program`` as the device sees it); its figures and schedule.
    ``packing``: how the blocks are placed in the arena (:func:`vmem.schedule.pack.pack`; ``"sweep"`` is
    faster and never packs tighter than ``"auto"``: a plan that fits with it fits). ``rows=False`` leaves
    the figures' per-layer rows out (a planner weighing candidates reads only the totals). ``accumulate``,
    ``update``: a micro-batch's step (:func:`vmem.schedule.lower.lower`)."""
    schedule = lower(program, decided, optimizer_slots, alignment, packing, accumulate=accumulate, update=update)
    figures = replay_if_fits(schedule, device, alignment, costs)
    thorough = placement(decided, packing)
    if (
        figures is None
        and thorough != packing
        and schedule.live_bytes is not None
        and schedule.live_bytes <= device.memory
    ):
        # a last resort, packed as tightly as it packs for any capacity, does not fit this one; placed for this
        # one, with more placements tried (as the oracle places it), it may
        placed = lower(
            program,
            decided,
            optimizer_slots,
            alignment,
            thorough,
            device.memory,
            accumulate=accumulate,
            update=update,
        )
        figures = replay_if_fits(placed, device, alignment, costs)
        schedule = placed if figures is not None else schedule
    if figures is None:
        figures = replay_fitting(schedule, device, alignment, costs)
    if rows:
        figures = dataclasses.replace(figures, layers=_layer_rows(program, decided))
    return PlanResult(decided, figures), schedule


def replay_if_fits(
    schedule: Schedule, device: DeviceSpec, alignment: int = 256, costs: "CostModel | None" = None, seconds: Any = None
) -> Figures | None:
    """The figures of ``schedule`` replayed on a simulated ``device``, or None where it does not fit (the
    replay stops where the pool overflows). ``seconds``: the steps' :func:`~vmem.schedule.replay.durations`
    under ``costs``, where already known."""
    if schedule.live_bytes is not None and schedule.live_bytes > device.memory:
        return None  # more bytes in use at once than the device has: no placement fits
    try:
        return replay(schedule, SimDevice(device, alignment=alignment), costs, seconds)
    except OutOfDeviceMemory:
        return None


def replay_fitting(
    schedule: Schedule, device: DeviceSpec, alignment: int = 256, costs: "CostModel | None" = None
) -> Figures:
    """The figures of ``schedule`` replayed on a simulated ``device``; one that does not fit is replayed
    again without a capacity, so that its figures are still given (``fits=False``)."""
    seconds = durations(schedule, costs) if costs is not None else None  # the same for both replays
    figures = replay_if_fits(schedule, device, alignment, costs, seconds)
    if figures is not None:
        return figures
    program = schedule.program
    try:
        unbounded = SimDevice(dataclasses.replace(device, memory=UNBOUNDED), alignment=alignment)
        figures = replay(schedule, unbounded, costs, seconds)
    except OutOfDeviceMemory:
        raise DoesNotFit(
            f"{program.network} at batch {program.batch}: one step needs more than "
            f"{format_bytes(UNBOUNDED)}; a batch this large cannot be planned"
        ) from None
    return dataclasses.replace(figures, fits=False)


@dataclass(frozen=True)
class Problem:
    """What :func:`validate` found wrong with a plan: ``kind`` is ``"invalid"`` (the plan cannot be carried
    out: it names a buffer the network lacks, or a backward or a rebuild needs a buffer the plan neither
    keeps, offloads nor recomputes) or ``"does not fit"`` (it runs, in more memory than the device has)."""

    kind: str
    message: str


def validate(
    program: Program,
    decided: Plan,
    device: DeviceSpec | None = None,
    *,
    alignment: int = 256,
    optimizer_slots: tuple[str, ...] = ("momentum",),
) -> list[Problem]:
    """Every problem of a decided plan for ``program`` (as the device sees it), without raising: empty when
    the plan can be carried out and, with a ``device``, fits it. A planner weighing candidates asks this
    instead of catching the lowering's and the replay's errors."""
    try:
        schedule = lower(program, decided, optimizer_slots, alignment)
    except PlanError as exc:
        return [Problem("invalid", str(exc))]
    if device is None:
        return []
    try:
        figures = replay_fitting(schedule, device, alignment)
    except PlanError as exc:
        return [Problem("does not fit", str(exc))]
    if figures.fits:
        return []
    return [
        Problem(
            "does not fit",
            f"{program.network} at batch {program.batch} under {decided.policy}: the step peaks at "
            f"{format_bytes(figures.peak_bytes)}, the device has {format_bytes(device.memory)}",
        )
    ]


def _layer_rows(program: Program, decided: Plan) -> tuple[LayerRow, ...]:
    rows = []
    for op in program.ops:
        out = program.tensors[op.output]
        owner = program.tensors[out.buffer].name
        algos = decided.algos.get(op.name)
        rows.append(
            LayerRow(
                name=op.name,
                kind=op.kind,
                shape=tuple(out.shape),
                bytes=out.nbytes,
                inplace=op.inplace,
                flops=op.flops,
                algos="/".join(algos[p] for p in PASSES) if algos else None,
                stash=decided.stash.get(owner) if out.stashed else None,
                codec=decided.codecs.get(owner) if out.stashed else None,
                workspace=max(op_workspace(program, decided, op.index)),
            )
        )
    return tuple(rows)
