"""``vmem.plan``: decide with a policy, lower to a schedule, and replay it on a simulated device.

The replay (:mod:`vmem.schedule.replay`) runs the schedule through the same pool code the executor uses,
on a :class:`~vmem.device.SimDevice` of the target's capacity (its pool and virtual streams), so the
peak includes alignment and fragmentation exactly; with a cost model it also predicts step time, stalls
and the time-weighted average. A plan that does not fit is replayed again without a capacity so that its
figures are still given (``fits=False``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

from . import policies
from .device.sim import SimDevice
from .device.spec import DeviceSpec
from .errors import OutOfDeviceMemory, PlanError
from .graph import PASSES, Network, Program
from .policies.base import fit_algorithms
from .policies.budget import largest_fitting, least_memory
from .policies.plan import Plan
from .schedule.collectives import largest_share, with_allreduce, with_sharded_optimizer
from .schedule import Schedule
from .schedule.lower import lower, op_workspace
from .schedule.replay import Figures, LayerRow, durations, replay
from .units import format_bytes

__all__ = [
    "plan",
    "largest_batch",
    "plan_program",
    "evaluate",
    "replay_fitting",
    "replay_if_fits",
    "floor_policy",
    "least_memory",
    "smallest_memory",
    "spec_of",
    "UNBOUNDED",
    "PlanResult",
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


def _cost_setup(program: Program, spec: DeviceSpec, costs: Any, catalog: Any = None) -> tuple[Program, Any]:
    """The program as the device sees it (its convolution catalog: ``catalog(program)`` from a Device, or
    cuDNN's as the simulator models it for a simulated GPU's spec) and its cost model (the roofline on a
    simulated GPU unless ``costs`` is given)."""
    if spec.kind == "sim":
        from .costs import Roofline, with_cudnn_catalog

        program = catalog(program) if catalog is not None else with_cudnn_catalog(program, spec.arch)
        return program, costs or Roofline(spec)
    return (catalog(program) if catalog is not None else program), costs


def evaluate(
    program: Program,
    device: DeviceSpec,
    decided: Plan,
    *,
    alignment: int = 256,
    optimizer_slots: tuple[str, ...] = ("momentum",),
    costs: Any = None,
    packing: str = "auto",
    rows: bool = True,
) -> tuple[PlanResult, Schedule]:
    """Lower a decided plan and replay it (``program`` as the device sees it); its figures and schedule.
    ``packing``: how the blocks are placed in the arena (:func:`vmem.schedule.pack.pack`; ``"sweep"`` is
    faster and never packs tighter than ``"auto"``: a plan that fits with it fits). ``rows=False`` leaves
    the figures' per-layer rows out (a planner weighing candidates reads only the totals)."""
    schedule = lower(program, decided, optimizer_slots, alignment, packing)
    figures = replay_fitting(schedule, device, alignment, costs)
    if rows:
        figures = dataclasses.replace(figures, layers=_layer_rows(program, decided))
    return PlanResult(decided, figures), schedule


def replay_if_fits(
    schedule: Schedule, device: DeviceSpec, alignment: int = 256, costs: Any = None, seconds: Any = None
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


def replay_fitting(schedule: Schedule, device: DeviceSpec, alignment: int = 256, costs: Any = None) -> Figures:
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
        raise PlanError(
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


def floor_policy(policy: Any) -> Any:
    """The policy whose plan is the least ``policy`` can need: itself (with ``algos=fit``, its
    least-workspace algorithms), or for ``vdnn-dyn`` and ``auto`` (which choose among others) vdnn-all with
    memory-optimal algorithms (for ``auto`` a bound: a plan that recomputes may need less)."""
    pol = policies.get(policy)
    if pol.name in ("vdnn-dyn", "auto"):
        return policies.get("vdnn-all:algos=memory")
    return policies.get(pol, algos="memory") if pol.algos == "fit" else pol


def plan_program(
    program: Program,
    device: DeviceSpec,
    policy: Any,
    *,
    alignment: int = 256,
    optimizer_slots: tuple[str, ...] = ("momentum",),
    costs: Any = None,
    baseline: bool = False,
    catalog: Any = None,
    nproc: int = 1,
    shard_optimizer: bool = False,
) -> tuple[PlanResult, Schedule]:
    """Decide, lower and replay for a built Program; the plan with its figures, and the Schedule.

    ``catalog`` (a Device's ``catalog``) gives the program the device's convolution algorithms. With
    ``baseline=True`` (and a cost model) the figures also carry the step time of ``baseline`` with the
    fastest algorithms, as an oracle when it does not fit. ``nproc`` > 1: one rank of a data-parallel run
    of that many (the program at the rank's batch): the gradients all-reduced in buckets during backward
    (:func:`vmem.schedule.collectives.with_allreduce`), their time over the spec's interconnect in the
    figures (``comm_seconds``, ``exposed_comm_seconds``); with ``shard_optimizer``, the optimizer's state
    sharded over the ranks (:func:`vmem.schedule.collectives.with_sharded_optimizer`), planned for the rank
    that keeps the most of it."""
    pol = policies.get(policy)
    program, costs = _cost_setup(program, device, costs, catalog)

    # the plan last lowered (kept, so that its id is not reused), its packing strategy and its schedule
    last: list[Any] = [None, None, None]

    def oracle(
        candidate: Plan, memory: int | None = None, packing: str = "auto", unfit: bool = True
    ) -> PlanResult | None:
        """``candidate`` lowered and replayed at ``memory`` (the device's where not given), its blocks
        placed (``packing``: see :func:`evaluate`) only as tightly as they need to be to fit it (the
        greedy orders run only where the sweeps' placement does not fit and the live bytes do; the
        planner's own figures, :func:`evaluate`, place them as tightly as they can). With
        ``unfit=False``, None where it does not fit (a planner that keeps only plans that fit needs no
        figures of the others: no second replay for them). The same plan asked again at another
        ``memory`` (a search for its least budget) is replayed, not lowered again, where it would be
        placed the same."""
        spec = device if memory is None else dataclasses.replace(device, memory=memory)
        schedule = last[2]
        if not (
            last[0] is candidate
            and last[1] == packing
            and schedule.placed_for is not None
            and schedule.placed_for[0] <= spec.memory < schedule.placed_for[1]
        ):  # not the plan last lowered, or not placed as it would be for this capacity
            schedule = lower(program, candidate, optimizer_slots, alignment, packing, spec.memory)
            last[:] = [candidate, packing, schedule]
        if unfit:
            return PlanResult(candidate, replay_fitting(schedule, spec, alignment, costs))
        figures = replay_if_fits(schedule, spec, alignment, costs)
        return None if figures is None else PlanResult(candidate, figures)

    decided = fit_algorithms(pol, program, device, costs, oracle, pol.decide(program, device, costs, oracle))
    decided = dataclasses.replace(decided, math=device.math)  # the device's FP32 math, recorded with the plan
    result, schedule = evaluate(
        program, device, decided, alignment=alignment, optimizer_slots=optimizer_slots, costs=costs
    )
    if nproc > 1:
        rank = largest_share(program, nproc) if shard_optimizer else None
        result, schedule = rank_plan(result, schedule, device, alignment, costs, nproc, rank)
    if baseline and costs is not None:
        base = policies.get("baseline:algos=performance").decide(program, device, costs)
        base_result = evaluate(
            program, device, base, alignment=alignment, optimizer_slots=optimizer_slots, costs=costs, rows=False
        )[0]
        figures = dataclasses.replace(result.figures, baseline_step_seconds=base_result.step_seconds)
        result = PlanResult(decided, figures)
    return result, schedule


def rank_plan(
    result: PlanResult,
    schedule: Schedule,
    device: DeviceSpec,
    alignment: int,
    costs: Any,
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


def smallest_memory(
    program: Program,
    device: DeviceSpec,
    policy: Any,
    *,
    alignment: int = 256,
    optimizer_slots: tuple[str, ...] = ("momentum",),
    catalog: Any = None,
) -> int | None:
    """The smallest device capacity (to ``alignment``) in which ``policy`` trains ``program``: its plan's
    blocks as they are packed, with the device's algorithms (``catalog``). For ``vdnn-dyn``, the least
    any of its choices needs: vdnn-all with memory-optimal algorithms. None above 4x the plan's peak."""
    pol = floor_policy(policy)
    unbounded = dataclasses.replace(device, memory=UNBOUNDED)
    program, _ = _cost_setup(program, device, None, catalog)

    def oracle(candidate: Plan, memory: int | None = None) -> PlanResult:
        spec = unbounded if memory is None else dataclasses.replace(device, memory=memory)
        return evaluate(program, spec, candidate, alignment=alignment, optimizer_slots=optimizer_slots, rows=False)[0]

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


def spec_of(device: Any, memory: int | str | None = None) -> tuple[DeviceSpec, int, Any]:
    """The spec (its capacity ``memory`` where given), pool alignment and catalog of a Device, a
    DeviceSpec or a device name."""
    from .device import device as make_device
    from .units import parse_bytes

    alignment, catalog = 256, None
    if isinstance(device, DeviceSpec):
        spec = device
    elif isinstance(device, str):
        if device in ("cpu", "cpu:0"):  # no need to start a CPU device's streams just to plan
            from .device.staging import cpu_catalog

            spec, catalog = DeviceSpec(name="cpu", kind="cpu", memory=1 << 30), cpu_catalog
        else:  # sim:<gpu>; names that are not available raise a clear DeviceError
            spec = make_device(device).spec
    else:
        spec = device.spec
        alignment, catalog = device.pool.alignment, device.catalog
    if memory is not None:
        spec = dataclasses.replace(spec, memory=parse_bytes(memory, name="memory"))
    return spec, alignment, catalog


def plan(
    net: Network,
    batch: int,
    device: Any = "cpu",
    policy: Any = "baseline",
    *,
    input_shape: Sequence[int] | None = None,
    dtype: str = "float32",
    precision: str = "fp32",
    optimizer_slots: tuple[str, ...] = ("momentum",),
    memory: int | str | None = None,
    costs: Any = None,
    nproc: int = 1,
    shard_optimizer: bool = False,
) -> PlanResult:
    """Plan one training step of ``net`` at ``batch`` on ``device`` under ``policy``, without running it.

    ``device`` is a Device, a DeviceSpec or a name (``"cpu"``, ``"sim:titan-x"``; ``memory=`` overrides
    its capacity). On a simulated GPU the plan predicts step time with the roofline cost model; on the
    CPU device, pass ``costs`` (a profile, see :meth:`vmem.Trainer.profile`) to predict time.
    ``optimizer_slots`` names the optimizer state per parameter (SGD with momentum: one). ``precision``
    (``"fp32"``, ``"fp16"``, ``"bf16"``) is what feature maps are stored in (:mod:`vmem.precision`).
    ``nproc``: one rank of a data-parallel run of that many, each at ``batch`` (its share), the gradients'
    all-reduce over the device's interconnect priced and overlapped with backward (the figures'
    ``comm_seconds`` and ``exposed_comm_seconds``); ``shard_optimizer``: the optimizer's state sharded over
    the ranks (ZeRO's stage 1), the rank that keeps the most of it planned.
    """
    if not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc={nproc!r} must be a positive int")
    spec, alignment, catalog = spec_of(device, memory)
    program = net.build(batch, input_shape, dtype, precision)
    result, _ = plan_program(
        program,
        spec,
        policy,
        alignment=alignment,
        optimizer_slots=optimizer_slots,
        costs=costs,
        baseline=True,
        catalog=catalog,
        nproc=nproc,
        shard_optimizer=shard_optimizer,
    )
    return result


def largest_batch(
    net: Network,
    device: Any = "cpu",
    *,
    memory: int | str | None = None,
    policy: Any = "auto",
    precision: str = "fp32",
    input_shape: Sequence[int] | None = None,
    dtype: str = "float32",
    optimizer_slots: tuple[str, ...] = ("momentum",),
    most: int = 1 << 16,
    progress: Any = None,
) -> int:
    """The largest batch (up to ``most``) whose training step ``policy`` plans to fit ``device`` (its
    capacity ``memory`` where given), with feature maps in ``precision``: 0 where not even batch 1 fits.
    Found by doubling from 1 and then bisecting, one plan a try (a plan that fits at a batch is assumed to
    fit at every smaller one). ``progress(batch, fits)`` is called after each try."""
    if isinstance(most, bool) or not isinstance(most, int) or most < 1:
        raise ValueError(f"largest_batch: most={most!r} must be a positive int")
    spec, alignment, catalog = spec_of(device, memory)

    def fits(batch: int) -> bool:
        program = net.build(batch, input_shape, dtype, precision)
        try:
            result, _ = plan_program(
                program, spec, policy, alignment=alignment, optimizer_slots=optimizer_slots, catalog=catalog
            )
            ok = bool(result.fits)
        except PlanError:  # the policy refuses: nothing it can choose fits
            ok = False
        if progress is not None:
            progress(batch, ok)
        return ok

    return largest_fitting(fits, most)
