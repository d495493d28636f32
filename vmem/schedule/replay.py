"""Replay: a Schedule run through a simulated device's pool and streams, giving its figures.

The replay allocates and frees every block of the step through the same :class:`~vmem.pool.DevicePool`
code the executor uses (at the planned offsets, on the same streams: offloaded blocks freed on the memory
stream with ``sync="event"``), so placement and fragmentation, and so the peak, are exactly the step's.
With a cost model it also runs the compute and memory streams' virtual clocks (copies wait for the
compute stream, the compute stream waits for copies as the executor would) to predict step time, stalls
and the time-weighted average usage; without one, compute steps are weighted by their FLOPs.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, TYPE_CHECKING

from ..graph import Program
from ..costs.collective import allreduce_seconds
from ..costs.model import CostModel, host_costs
from ..pool import CATEGORIES
from ..streams.virtual import VirtualStream
from .steps import (
    Accumulate,
    AccumulateParam,
    Alloc,
    Backward,
    CopyOut,
    Decode,
    Encode,
    Forward,
    Free,
    Loss,
    Offload,
    Prefetch,
    Recompute,
    Release,
    Schedule,
    Step,
    AllReduce,
    WaitAllReduce,
    Broadcast,
    Update,
    Upload,
    WaitPrefetch,
    handlers,
)

if TYPE_CHECKING:
    from ..device.sim import SimDevice

__all__ = ["Figures", "LayerRow", "replay", "durations"]


@dataclass(frozen=True)
class LayerRow:
    """One layer of a plan: its output, algorithms, what happens to its stashed output, its workspace."""

    name: str
    kind: str
    shape: tuple[int, ...]
    bytes: int
    inplace: bool
    flops: int
    algos: str | None  # "forward/backward_data/backward_filter"
    stash: str | None  # "keep" | "offload" | "encode" where backward reads the output's buffer
    codec: str | None
    workspace: int

    def __getitem__(self, field_name: str) -> Any:
        """Rows read like the mappings ``to_dict`` gives: ``row["name"]``."""
        try:
            return getattr(self, field_name)
        except AttributeError:
            raise KeyError(field_name) from None


@dataclass(frozen=True)
class Figures:
    """What a plan costs, from a replay: pool bytes (peak, time-weighted average, per category), bytes
    offloaded, whether it fits, and with a cost model the predicted step time, stalls and update time."""

    peak_bytes: int
    average_bytes: float
    by_category: dict[str, dict[str, float]]
    offloaded_bytes: int
    fits: bool = True
    step_seconds: float | None = None
    stall_seconds: float | None = None
    update_seconds: float | None = None  # the optimizer's share of step_seconds
    #: a data-parallel step (``Schedule.world`` > 1): the gradients' all-reduces' seconds on the
    #: communication stream, and the part of them compute waited for (not hidden behind backward)
    comm_seconds: float | None = None
    exposed_comm_seconds: float | None = None
    baseline_step_seconds: float | None = None  # baseline with the fastest algorithms (the oracle)
    precision: str = "fp32"  # what the feature maps are stored in (vmem.precision)
    layers: tuple[LayerRow, ...] = field(default=(), repr=False)
    #: per layer, the most pool bytes in use while its forward or backward ran (where a plan overflows)
    layer_peaks: dict[str, int] = field(default_factory=dict, repr=False)
    #: where the most pool bytes were in use while a layer ran: ``"forward conv3"``, ``"backward conv3"``,
    #: ``"recompute relu2"`` (None if no layer ran)
    peak_at: str | None = None
    #: the most bytes the plan's blocks hold at any one moment (persistent buffers included), however placed:
    #: the peak before packing (``peak_bytes`` is after: with the gaps placement leaves)
    live_bytes: int | None = None

    @property
    def packing(self) -> float | None:
        """The packed peak over the most bytes live at once: what placement costs (1.0: nothing)."""
        return None if not self.live_bytes else self.peak_bytes / self.live_bytes

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["packing"] = self.packing
        out["layers"] = [dict(row, shape=list(row["shape"])) for row in out["layers"]]
        return out


def durations(schedule: Schedule, costs: CostModel) -> list[float]:
    """Predicted seconds of each step of the schedule under ``costs`` (0 for steps that are not compute)."""
    program = schedule.program
    # an update reads and writes the master weights of its bucket
    master = program.precision.itemsize("master")
    sizes = {f"{op.name}.{k}": math.prod(s.shape) * master for op, k, s in program.owned_params() if s.trainable}
    params = sum(sizes.values())

    def update(st: Update) -> float:
        return costs.update_seconds(params if st.params is None else sum(sizes[k] for k in st.params))

    def backward(st: Backward) -> float:
        op = program.ops[st.op]
        if op.kind != "conv":
            return costs.op_seconds(op, "backward", None)
        data_algo, filter_algo = st.algos or (None, None)
        t = costs.op_seconds(op, "backward_filter", filter_algo) if st.part != "data" else 0.0
        if schedule.needs_grad[op.inputs[0]] and st.part != "filter":
            t += costs.op_seconds(op, "backward_data", data_algo)
        return t

    table = handlers(
        {
            Forward: lambda st: costs.op_seconds(program.ops[st.op], "forward", st.algo),
            Recompute: lambda st: costs.op_seconds(program.ops[st.op], "forward", st.algo),
            Backward: backward,
            Loss: lambda st: costs.misc_seconds("loss", 0),
            Accumulate: lambda st: costs.misc_seconds("acc", program.tensors[st.tensor].nbytes),
            AccumulateParam: lambda st: costs.misc_seconds("acc", st.nbytes),
            Update: update,
            AllReduce: None,  # on the communication stream (priced by the replay)
            WaitAllReduce: None,
            Broadcast: None,
            Encode: lambda st: costs.misc_seconds("encode", st.nbytes + st.enc_nbytes),
            Decode: lambda st: costs.misc_seconds("decode", st.nbytes + st.enc_nbytes),
            Alloc: None,
            Free: None,
            Upload: None,
            Offload: None,
            Release: None,
            Prefetch: None,
            WaitPrefetch: None,
            CopyOut: None,
        },
        "durations",
    )
    return [0.0 if table[type(st)] is None else table[type(st)](st) for st in schedule.steps]  # type: ignore[misc]


def _flops_weight(program: Program, st: Step) -> float:
    """Without a cost model: forward by FLOPs, backward twice that, other compute steps 1."""
    if type(st) is Forward or type(st) is Recompute:
        return max(program.ops[st.op].flops, 1)
    if type(st) is Backward:  # each half of a split backward: the forward's FLOPs
        return (2 if st.part == "all" else 1) * max(program.ops[st.op].flops, 1)
    return 1


_PHASE = {Forward: "forward", Backward: "backward", Recompute: "recompute"}


class _Replay:
    """One replay of a schedule on a simulated device; ``run`` returns its Figures (without layer rows)."""

    def __init__(
        self,
        schedule: Schedule,
        device: SimDevice,
        costs: "CostModel | None" = None,
        seconds: list[float] | None = None,
    ):
        self.schedule, self.costs = schedule, costs
        self.pool = device.pool
        self.compute, self.memory = device.compute_stream, device.memory_stream
        self.spec = device.spec
        self.comm = VirtualStream("comm", host=device.compute_stream.host)  # a data-parallel step's all-reduces
        self.reduced: dict[int, Any] = {}  # bucket -> its all-reduce's end
        self.comm_busy = self.exposed = 0.0
        if costs is not None and seconds is None:
            seconds = durations(schedule, costs)
        self.seconds = seconds if costs is not None else None
        overheads = getattr(costs, "host_overheads", None) if costs is not None else None  # optional in a model
        #: the host's part (see CostModel.host_overheads): enqueueing a step before its streams start, each
        #: stream item's own handling, and what each copy on the memory stream takes from the compute
        #: stream (the CPU device's streams share its cores and the interpreter's lock)
        host = host_costs(overheads()) if overheads is not None else (0.0, 0.0, 0.0)
        self.per_step, self.per_item, self.per_copy = host
        self.blocks: dict = {}
        self.ready: dict = {}  # prefetched key -> its copy's event
        self.copied: dict = {}  # offloaded key -> its copy's event
        self.weighted = {c: 0.0 for c in CATEGORIES}  # per category: bytes in use x weight, summed
        self.use = dict.fromkeys(CATEGORIES, 0)  # per category: bytes in use (aligned, as the pool holds them)
        self.since = dict.fromkeys(CATEGORIES, 0.0)  # per category: the weight accounted when it last changed
        self.layer_peaks: dict[str, int] = {}
        self.peak_at: str | None = None
        self.peak_in_use = -1
        self.total_weight = self.weighted_all = self.stall = 0.0
        compute = self._compute
        self.table = handlers(
            {
                Alloc: self._alloc,
                Free: self._free,
                Offload: self._offload,
                Release: self._release,
                Prefetch: self._prefetch,
                WaitPrefetch: self._wait,
                Forward: compute,
                Recompute: compute,
                Backward: compute,
                Loss: compute,
                Accumulate: compute,
                AccumulateParam: compute,
                Update: compute,
                AllReduce: self._allreduce,
                WaitAllReduce: self._wait_allreduce,
                Broadcast: self._broadcast,
                Encode: compute,
                Decode: compute,
                Upload: None,
                CopyOut: None,
            },
            "replay",
        )

    def run(self) -> Figures:
        pool = self.pool
        for buf in self.schedule.persistent:
            block = pool.allocate(buf.nbytes, None, buf.category)
            self._changed(buf.category, block.size)
        if self.seconds is not None and self.per_step:  # the streams start once the host has enqueued the step
            enqueued = self.per_step * len(self.schedule.steps)
            self.compute.run(enqueued)
            self.memory.run(enqueued)
        for index, st in enumerate(self.schedule.steps):
            handler = self.table[type(st)]
            if handler is not None:
                handler(index, st)
        for c in CATEGORIES:
            self._changed(c, 0)
        stats = pool.stats()
        total = self.total_weight
        timed = self.seconds is not None
        return Figures(
            peak_bytes=stats.peak,
            average_bytes=self.weighted_all / total if total else float(stats.peak),
            by_category={
                c: {"peak": s.peak, "average": self.weighted[c] / total if total else 0.0}
                for c, s in stats.by_category.items()
            },
            offloaded_bytes=self.schedule.offloaded_bytes,
            step_seconds=max(self.compute.clock, self.memory.clock) if timed else None,
            stall_seconds=self.stall if timed else None,
            comm_seconds=self.comm_busy if timed and self.schedule.world > 1 else None,
            exposed_comm_seconds=self.exposed if timed and self.schedule.world > 1 else None,
            update_seconds=sum(
                self.seconds[i]  # type: ignore[index, misc]
                for i, st in enumerate(self.schedule.steps)
                if type(st) is Update
            )
            if timed
            else None,
            layer_peaks=self.layer_peaks,
            peak_at=self.peak_at,
            live_bytes=self.schedule.live_bytes,
            precision=self.schedule.program.precision.name,
        )

    def account(self, weight: float) -> None:
        """``weight`` (seconds, or FLOPs) passes at the pool's present usage."""
        if weight <= 0:
            return
        self.total_weight += weight
        self.weighted_all += weight * self.pool.in_use

    def _changed(self, category: str, delta: int) -> None:
        """``category``'s usage changes by ``delta`` bytes: the weight since its last change is accounted at
        the usage it had (one category changes at a time: no pass over every category per step)."""
        self.weighted[category] += self.use[category] * (self.total_weight - self.since[category])
        self.since[category] = self.total_weight
        self.use[category] += delta

    def _alloc(self, index: int, st: Alloc) -> None:
        buf = st.buffer
        clock = self.compute.clock
        block = self.blocks[buf.key] = self.pool.allocate(
            buf.nbytes, self.compute, buf.category, high=buf.high, offset=st.offset
        )
        self._changed(buf.category, block.size)
        if self.seconds is not None:  # the pool may have made compute (or the host) wait for a copy still running
            self._stalled(self.compute.clock - clock + self.compute.catch_up())

    def _free(self, index: int, st: Free) -> None:
        block = self.blocks.pop(st.key)
        self._changed(block.category, -block.size)
        self.pool.free(block, self.compute)

    def _compute(self, index: int, st: Step) -> None:
        if isinstance(st, (Forward, Backward, Recompute)):
            name, in_use = self.schedule.program.ops[st.op].name, self.pool.in_use
            self.layer_peaks[name] = max(self.layer_peaks.get(name, 0), in_use)
            if in_use > self.peak_in_use:
                self.peak_in_use, self.peak_at = in_use, f"{_PHASE[type(st)]} {name}"
        if self.seconds is None:
            self.account(_flops_weight(self.schedule.program, st))
            return
        self.compute.run(self.seconds[index] + self.per_item)
        self.account(self.seconds[index])

    def _offload(self, index: int, st: Offload) -> None:
        """The copy starts on the memory stream once compute has written the buffer for the last time."""
        if self.seconds is not None and self.costs is not None:  # timed (the durations come from costs)
            self.memory.wait(self.compute.record())
            self.memory.run(self.costs.copy_seconds(st.transfer_nbytes, "d2h") + self.per_item)
            self.copied[st.key] = self.memory.record()
            if self.per_copy:
                self.compute.run(self.per_copy)

    def _release(self, index: int, st: Release) -> None:
        """Freed after its copy: by compute (sync=layer, which waits for it) or by the memory stream."""
        block = self.blocks.pop(st.key)
        done = self.copied.pop(st.key, None)
        if st.sync == "event":
            self.memory.wait(self.compute.record())  # after the readers, as the executor orders it
        elif done is not None:
            self._stalled(self.compute.wait(done))
            self.compute.run(self.per_item)  # the wait is an item of the compute stream
        self._changed(block.category, -block.size)
        self.pool.free(block, self.memory if st.sync == "event" else self.compute)

    def _prefetch(self, index: int, st: Prefetch) -> None:
        if self.seconds is not None and self.costs is not None:  # timed (the durations come from costs)
            self.memory.wait(self.compute.record())
            self.memory.run(self.costs.copy_seconds(st.transfer_nbytes, "h2d") + self.per_item)
            self.ready[st.key] = self.memory.record()
            if self.per_copy:
                self.compute.run(self.per_copy)

    def _wait(self, index: int, st: WaitPrefetch) -> None:
        event = self.ready.pop(st.key, None)
        if event is not None:
            self._stalled(self.compute.wait(event))
            self.compute.run(self.per_item)  # the wait is an item of the compute stream

    def _allreduce(self, index: int, st: AllReduce) -> None:
        """A bucket's all-reduce on the communication stream, once compute has written its gradients: a ring
        over the spec's interconnect (:mod:`vmem.costs.collective`)."""
        if self.seconds is not None:
            self.comm.wait(self.compute.record())
            took = allreduce_seconds(self.spec, st.nbytes, self.schedule.world)
            self.comm.run(took)
            self.comm_busy += took
            self.reduced[st.bucket] = self.comm.record()

    def _broadcast(self, index: int, st: Broadcast) -> None:
        """The updated weights to every rank (each from its owner): an all-gather's time, a ring moving
        (N - 1) / N of them; the step ends when it has (the next step's forward reads them)."""
        if self.seconds is not None:
            self.comm.wait(self.compute.record())
            took = allreduce_seconds(self.spec, st.nbytes, self.schedule.world) / 2  # half an all-reduce's ring
            self.comm.run(took)
            self.comm_busy += took
            waited = self.compute.wait(self.comm.record())
            self.exposed += waited
            self._stalled(waited)

    def _wait_allreduce(self, index: int, st: WaitAllReduce) -> None:
        event = self.reduced.pop(st.bucket, None)
        if event is not None:
            waited = self.compute.wait(event)
            self.exposed += waited
            self._stalled(waited)

    def _stalled(self, seconds: float) -> None:
        self.account(seconds)
        self.stall += seconds


def replay(
    schedule: Schedule, device: SimDevice, costs: "CostModel | None" = None, seconds: list[float] | None = None
) -> Figures:
    """Replay ``schedule`` on ``device`` (a simulated device: a pool without data, virtual streams); raises
    OutOfDeviceMemory if its capacity is exceeded. With ``costs`` the figures include predicted time
    (``seconds``: each step's :func:`durations` under them, where already known)."""
    return _Replay(schedule, device, costs, seconds).run()
