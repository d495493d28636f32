"""``vmem.plan``: decide with a policy, lower to a schedule, and replay its allocations through the pool.

The replay uses the same :class:`~vmem.pool.DevicePool` code the executor uses, over an arena-less pool
of the device's capacity, so the peak includes alignment and fragmentation exactly. A plan that does not
fit is replayed again in an unbounded pool so that its figures are still given (``fits=False``).
"""

from __future__ import annotations

from typing import Any, Sequence

from . import policies
from .device.base import Device, DeviceSpec
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


def replay(schedule: Schedule, program: Program, capacity: int, alignment: int = 256,
           sync: str | None = None) -> dict[str, Any]:
    """Replay persistent and per-step allocations; raise OutOfDeviceMemory if ``capacity`` is exceeded.

    The step's blocks are allocated and freed on a stand-in compute stream, and offloaded buffers freed
    on a stand-in memory stream when ``sync="event"``, exactly as the executor does, so placement and
    fragmentation match. Returns peak, time-weighted average (ops weighted by their FLOPs, a stand-in
    for time until a profile exists) and per-category peaks and averages.
    """
    pool = DevicePool(capacity, alignment, name="plan")
    compute, memory = _Stream("compute"), _Stream("memory")
    for buf in schedule.persistent:
        pool.allocate(buf.nbytes, None, buf.category)
    blocks = {}
    weighted = {c: 0.0 for c in CATEGORIES}
    total_weight = 0.0
    weighted_all = 0.0
    ops = program.ops
    for st in schedule.steps:
        kind = st[0]
        if kind == "alloc":
            buf = schedule.buffers[st[1]]
            blocks[buf.name] = pool.allocate(buf.nbytes, compute, buf.category, high=buf.high)
        elif kind == "free":
            pool.free(blocks.pop(st[1]), compute)
        elif kind == "offload":  # released after its copy: by compute (sync=layer) or the memory stream
            pool.free(blocks.pop(st[1]), memory if sync == "event" else compute)
        elif kind in ("prefetch", "wait"):
            continue
        else:
            if kind == "fwd":
                w = max(ops[st[1]].flops, 1)
            elif kind == "bwd":
                w = 2 * max(ops[st[1]].flops, 1)
            else:
                w = 1
            total_weight += w
            stats = pool.stats()
            weighted_all += w * stats.in_use
            for c, s in stats.by_category.items():
                weighted[c] += w * s.in_use
    stats = pool.stats()
    return {
        "peak": stats.peak,
        "average": weighted_all / total_weight if total_weight else float(stats.peak),
        "by_category": {c: {"peak": s.peak, "average": weighted[c] / total_weight if total_weight else 0.0}
                        for c, s in stats.by_category.items()},
    }


def plan_program(program: Program, device: DeviceSpec, policy: Any, *, alignment: int = 256,
                 optimizer_slots: tuple[str, ...] = ("momentum",)) -> tuple[Plan, Schedule]:
    """Decide, lower and replay for a built Program; return the Plan with its figures and the Schedule."""
    from .errors import OutOfDeviceMemory

    pol = policies.get(policy)
    result = pol.decide(program, device)
    schedule = lower(program, result, optimizer_slots)
    try:
        figures = replay(schedule, program, device.memory, alignment, result.sync)
        result.fits = True
    except OutOfDeviceMemory:
        figures = replay(schedule, program, _UNBOUNDED, alignment, result.sync)
        result.fits = False
    result.peak_bytes = figures["peak"]
    result.average_bytes = figures["average"]
    result.by_category = figures["by_category"]
    result.offloaded_bytes = sum(schedule.buffers[st[1]].nbytes for st in schedule.steps if st[0] == "offload")
    result.layers = _layer_rows(program, result)
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
            "workspace": max(fwd_ws, bwd_ws),
        })
    return rows


def plan(net: Network, batch: int, device: "Device | DeviceSpec | str" = "cpu", policy: Any = "baseline", *,
         input_shape: Sequence[int] | None = None, dtype: str = "float32",
         optimizer_slots: tuple[str, ...] = ("momentum",), memory: int | str | None = None) -> Plan:
    """Plan one training step of ``net`` at ``batch`` on ``device`` under ``policy``, without running it.

    ``device`` is a Device, a DeviceSpec or a name (``"cpu"``; ``memory=`` sets its capacity).
    ``optimizer_slots`` names the optimizer state per parameter (SGD with momentum: one).
    """
    from .device import device as make_device
    from .units import parse_bytes

    alignment = 256
    if isinstance(device, DeviceSpec):
        spec = device
    elif isinstance(device, str):
        from .device.base import DeviceSpec as _Spec

        capacity = parse_bytes(memory, name="memory") if memory is not None else 1 << 30
        if device not in ("cpu", "cpu:0"):
            make_device(device)  # raises a clear error for names that are not available
        spec = _Spec(name="cpu", kind="cpu", memory=capacity)
    else:
        spec = device.spec
        alignment = device.pool.alignment
    program = net.build(batch, input_shape, dtype)
    result, _ = plan_program(program, spec, policy, alignment=alignment, optimizer_slots=optimizer_slots)
    return result
