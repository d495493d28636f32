"""``vmem.plan``: decide with a policy, lower to a schedule, and replay it through the pool code.

The replay uses the same :class:`~vmem.pool.DevicePool` code the executor uses, over an arena-less pool
of the device's capacity, with stand-in compute and memory streams, so the peak includes alignment and
fragmentation exactly. With a cost model it also runs the schedule on two virtual clocks (compute and
memory streams, with the waits the executor would make) to predict step time, stalls and the
time-weighted average usage. A plan that does not fit is replayed again in an unbounded pool so that its
figures are still given (``fits=False``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

from . import policies
from .device.base import Device, DeviceSpec
from .errors import OutOfDeviceMemory
from .graph import Network, Program
from .policies.plan import Plan
from .pool import CATEGORIES, DevicePool
from .schedule import Schedule, lower, op_workspace

__all__ = ["plan", "replay", "plan_program"]

_UNBOUNDED = 1 << 60


class _Event:
    """An event of a replayed stream: it completes only when the host waits for it."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True


class _Stream:
    """A stand-in stream for the replay (the pool only records events on it)."""

    def __init__(self, name: str):
        self.name = name

    def record(self, event: Any = None) -> _Event:
        return _Event()

    def launch(self, fn: Any, *args: Any) -> None:  # pragma: no cover - the pool never launches
        pass


def _durations(program: Program, plan: Plan, schedule: Schedule, costs: Any) -> dict[int, float]:
    """Predicted seconds of each compute step of the schedule (by step index)."""
    out: dict[int, float] = {}
    ops = program.ops
    params = sum(math.prod(s.shape) for op in ops for s in op.params.values() if s.trainable) * program.itemsize
    for index, st in enumerate(schedule.steps):
        kind = st[0]
        if kind == "fwd":
            op = ops[st[1]]
            out[index] = costs.op_seconds(op, "forward", plan.algos.get(op.name, {}).get("forward"))
        elif kind == "bwd":
            op = ops[st[1]]
            if op.kind == "conv":
                algos = plan.algos.get(op.name, {})
                t = costs.op_seconds(op, "backward_filter", algos.get("backward_filter"))
                if schedule.needs_grad[op.inputs[0]]:
                    t += costs.op_seconds(op, "backward_data", algos.get("backward_data"))
            else:
                t = costs.op_seconds(op, "backward", None)
            out[index] = t
        elif kind == "loss":
            out[index] = costs.misc_seconds("loss", 0)
        elif kind == "acc":
            out[index] = costs.misc_seconds("acc", program.tensors[st[1]].nbytes)
        elif kind == "update":
            out[index] = costs.update_seconds(params)
        elif kind in ("encode", "decode"):
            out[index] = costs.misc_seconds(kind, schedule.buffers[st[1]].nbytes)
    return out


def replay(schedule: Schedule, program: Program, capacity: int, alignment: int = 256, sync: str | None = None,
           durations: dict[int, float] | None = None, costs: Any = None) -> dict[str, Any]:
    """Replay persistent and per-step allocations; raise OutOfDeviceMemory if ``capacity`` is exceeded.

    The step's blocks are allocated and freed on a stand-in compute stream, and offloaded buffers freed
    on a stand-in memory stream when ``sync="event"``, exactly as the executor does, so placement and
    fragmentation match. With ``durations`` (seconds per compute step) and ``costs`` (for copies) the
    two streams' clocks are simulated: the result then has ``seconds`` and ``stall_seconds``, and the
    average is weighted by time; without, compute steps are weighted by their FLOPs.
    """
    pool = DevicePool(capacity, alignment, name="plan")
    compute, memory = _Stream("compute"), _Stream("memory")
    for buf in schedule.persistent:
        pool.allocate(buf.nbytes, None, buf.category)
    blocks = {}
    weighted = {c: 0.0 for c in CATEGORIES}
    total_weight = weighted_all = 0.0
    tc = tm = stall = 0.0  # the compute and memory streams' clocks
    ready: dict[str, float] = {}
    ops = program.ops

    def account(w: float) -> None:
        nonlocal total_weight, weighted_all
        if w <= 0:
            return
        total_weight += w
        weighted_all += w * pool.in_use
        for c, v in pool.usage().items():
            weighted[c] += w * v

    for index, st in enumerate(schedule.steps):
        kind = st[0]
        if kind == "alloc":
            buf = schedule.buffers[st[1]]
            blocks[buf.name] = pool.allocate(buf.nbytes, compute, buf.category, high=buf.high,
                                             offset=schedule.offsets.get(index))
        elif kind == "free":
            pool.free(blocks.pop(st[1]), compute)
        elif kind == "offload":  # released after its copy: by compute (sync=layer) or the memory stream
            block = blocks.pop(st[1])
            if durations is not None:
                tm = max(tm, tc) + costs.copy_seconds(schedule.transfer.get(st[1], block.nbytes), "d2h")
                if sync != "event":
                    account(max(0.0, tm - tc))
                    stall += max(0.0, tm - tc)
                    tc = max(tc, tm)
            pool.free(block, memory if sync == "event" else compute)
        elif kind == "prefetch":
            if durations is not None:
                tm = max(tm, tc) + costs.copy_seconds(
                    schedule.transfer.get(st[1], schedule.buffers[st[1]].nbytes), "h2d")
                ready[st[1]] = tm
        elif kind == "wait":
            if durations is not None:
                t = ready.pop(st[1], tc)
                account(max(0.0, t - tc))
                stall += max(0.0, t - tc)
                tc = max(tc, t)
        else:
            if durations is not None:
                w = durations.get(index, 0.0)
                tc += w
            elif kind == "fwd":
                w = max(ops[st[1]].flops, 1)
            elif kind == "bwd":
                w = 2 * max(ops[st[1]].flops, 1)
            else:
                w = 1
            account(w)
    stats = pool.stats()
    result = {
        "peak": stats.peak,
        "average": weighted_all / total_weight if total_weight else float(stats.peak),
        "by_category": {c: {"peak": s.peak, "average": weighted[c] / total_weight if total_weight else 0.0}
                        for c, s in stats.by_category.items()},
    }
    if durations is not None:
        result["seconds"] = max(tc, tm)
        result["stall_seconds"] = stall
        result["update_seconds"] = sum(durations.get(i, 0.0) for i, st in enumerate(schedule.steps)
                                       if st[0] == "update")
    return result


def _cost_setup(program: Program, device: DeviceSpec, costs: Any) -> tuple[Program, Any]:
    """The program as the device sees it (cuDNN's catalog on a simulated GPU) and its cost model."""
    if device.kind == "sim":
        from .costs import Roofline, with_cudnn_catalog

        return with_cudnn_catalog(program, device.arch), costs or Roofline(device, program.itemsize)
    return program, costs


def evaluate(program: Program, device: DeviceSpec, result: Plan, *, alignment: int = 256,
             optimizer_slots: tuple[str, ...] = ("momentum",), costs: Any = None) -> tuple[Plan, Schedule]:
    """Lower a decided plan and fill in its figures by replay (``program`` as the device sees it)."""
    schedule = lower(program, result, optimizer_slots)
    durations = _durations(program, result, schedule, costs) if costs is not None else None
    try:
        figures = replay(schedule, program, device.memory, alignment, result.sync, durations, costs)
        result.fits = True
    except OutOfDeviceMemory:
        figures = replay(schedule, program, _UNBOUNDED, alignment, result.sync, durations, costs)
        result.fits = False
    result.peak_bytes = figures["peak"]
    result.average_bytes = figures["average"]
    result.by_category = figures["by_category"]
    result.step_seconds = figures.get("seconds")
    result.stall_seconds = figures.get("stall_seconds")
    result.update_seconds = figures.get("update_seconds")
    result.offloaded_bytes = sum(schedule.transfer.get(st[1], schedule.buffers[st[1]].nbytes)
                                 for st in schedule.steps if st[0] == "offload")
    result.layers = _layer_rows(program, result)
    return result, schedule


def plan_program(program: Program, device: DeviceSpec, policy: Any, *, alignment: int = 256,
                 optimizer_slots: tuple[str, ...] = ("momentum",), costs: Any = None,
                 baseline: bool = False) -> tuple[Plan, Schedule]:
    """Decide, lower and replay for a built Program; return the Plan with its figures and the Schedule.

    With ``baseline=True`` (and a cost model) the plan also carries the step time of ``baseline`` with
    the fastest algorithms, as an oracle when it does not fit."""
    pol = policies.get(policy)
    program, costs = _cost_setup(program, device, costs)

    def oracle(candidate: Plan, memory: int | None = None) -> Plan:
        spec = device if memory is None else dataclasses.replace(device, memory=memory)
        return evaluate(program, spec, candidate, alignment=alignment, optimizer_slots=optimizer_slots,
                        costs=costs)[0]

    result = pol.decide(program, device, costs, oracle)
    result, schedule = evaluate(program, device, result, alignment=alignment, optimizer_slots=optimizer_slots,
                                costs=costs)
    if baseline and costs is not None:
        base = policies.get("baseline:algos=performance").decide(program, device, costs)
        result.baseline_step_seconds = oracle(base).step_seconds
    return result, schedule


def _layer_rows(program: Program, result: Plan) -> list[dict[str, Any]]:
    rows = []
    for op in program.ops:
        out = program.tensors[op.output]
        algos = result.algos.get(op.name)
        fwd_ws, bwd_ws = op_workspace(program, result, op.index)
        rows.append({
            "name": op.name, "kind": op.kind, "shape": list(out.shape), "bytes": out.nbytes,
            "inplace": op.inplace, "flops": op.flops,
            "algos": "/".join(algos[p] for p in ("forward", "backward_data", "backward_filter")) if algos else None,
            "stash": result.stash.get(program.tensors[out.buffer].name) if out.stashed else None,
            "codec": result.codecs.get(program.tensors[out.buffer].name) if out.stashed else None,
            "workspace": max(fwd_ws, bwd_ws),
        })
    return rows


def plan(net: Network, batch: int, device: "Device | DeviceSpec | str" = "cpu", policy: Any = "baseline", *,
         input_shape: Sequence[int] | None = None, dtype: str = "float32",
         optimizer_slots: tuple[str, ...] = ("momentum",), memory: int | str | None = None,
         costs: Any = None) -> Plan:
    """Plan one training step of ``net`` at ``batch`` on ``device`` under ``policy``, without running it.

    ``device`` is a Device, a DeviceSpec or a name (``"cpu"``, ``"sim:titan-x"``; ``memory=`` overrides
    its capacity). On a simulated GPU the plan predicts step time with the roofline cost model; on the
    CPU device, pass ``costs`` (a profile, see :meth:`vmem.Trainer.profile`) to predict time.
    ``optimizer_slots`` names the optimizer state per parameter (SGD with momentum: one).
    """
    from dataclasses import replace

    from .device import device as make_device
    from .units import parse_bytes

    alignment = 256
    if isinstance(device, DeviceSpec):
        spec = device
    elif isinstance(device, str):
        if device in ("cpu", "cpu:0"):  # no need to start a CPU device's streams just to plan
            spec = DeviceSpec(name="cpu", kind="cpu", memory=1 << 30)
        else:  # sim:<gpu>; names that are not available raise a clear DeviceError
            spec = make_device(device).spec
    else:
        spec = device.spec
        alignment = device.pool.alignment
    if memory is not None:
        spec = replace(spec, memory=parse_bytes(memory, name="memory"))
    program = net.build(batch, input_shape, dtype)
    result, _ = plan_program(program, spec, policy, alignment=alignment, optimizer_slots=optimizer_slots,
                             costs=costs, baseline=True)
    return result
