"""The executor carries out a Schedule on a device. It decides nothing and reads nothing but the Schedule
(with the Program it was lowered from, for the layers and shapes) and the device.

Allocation and frees happen on the host, in schedule order, against the device pool with the compute
stream (so reuse is stream-ordered); every op is enqueued on the compute stream and runs asynchronously.
Each op records its start and end time on the stream and the pool's usage while it ran: that is the
step's timeline, from which the time-weighted average usage is computed. Steps are dispatched on their
type through one table (:func:`vmem.schedule.steps.handlers` checks it covers every kind); offloads,
prefetches and encodings are in :mod:`.transfers`, the optimizer's side of a step in :mod:`.update`, float32
compute over half storage in :mod:`.staged`, the report in :mod:`.report`. What stays here is one job, a
handler for each of the twenty step kinds and the step around them, which is why the module runs past 500
lines.

If anything fails during a step (an out-of-memory error, an error in a layer), every block the step
allocated is returned, so the pool is exactly as it was before the step.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any, Hashable, Sequence, TYPE_CHECKING

import numpy as np

from ..codecs import native
from ..codecs import step as step_kernels
from ..codecs.base import is_device_array
from ..device.staging import copy_nbytes, staged
from ..errors import DeviceError
from ..nn.base import Ctx, physical
from ..nn.loss import LossWork, SoftmaxCrossEntropy
from ..optim import Optimizer
from ..schedule import Key, Kind, Schedule
from ..schedule.steps import (
    AllReduce,
    Broadcast,
    WaitAllReduce,
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
    Update,
    Upload,
    WaitPrefetch,
    handlers,
)
from .params import DeviceParams
from .update import Updates
from .report import StepReport
from .staged import staged_backward, staged_forward
from .graphs import Graph, Recorded, StepGraphs, pool_state
from .timeline import Timeline
from .transfers import _BYTE, Transfers, span

if TYPE_CHECKING:
    from .._typing import Array
    from ..pool._bestfit import Block
    from numpy.typing import DTypeLike
    from ..device.base import Device
    from ..distributed.group import ProcessGroup
    from ..graph import Program

__all__ = ["Executor", "StepReport"]

_LABELS, _PROBS, _LOSS = Key(Kind.LABELS), Key(Kind.PROBS), Key(Kind.LOSS)


#: one lock per device: a step holds its device's while it runs
_STEPS: "weakref.WeakKeyDictionary[Any, threading.Lock]" = weakref.WeakKeyDictionary()
_STEPS_GUARD = threading.Lock()


def _stepping(device: Any) -> threading.Lock:
    """The lock a step holds on ``device`` while it runs."""
    with _STEPS_GUARD:
        lock = _STEPS.get(device)
        if lock is None:
            lock = _STEPS[device] = threading.Lock()
        return lock


class _Uncaptured(Exception):
    """A step's capture failed: it is rolled back and run as it is."""


class HostBatch:
    """A batch's input arrays as a step uploads them (:meth:`Executor.host_batch`); ``nchw``: per array,
    whether it is a float32 NCHW map that the device transposes and casts itself."""

    __slots__ = ("arrays", "nchw")

    def __init__(self, arrays: list[Array], nchw: list[bool] | None = None):
        self.arrays = arrays
        self.nchw = nchw or [False] * len(arrays)


class _Run:
    """The state of one step: its blocks, its offloads and encodings, the batch, the timeline."""

    def __init__(self, xs: list[np.ndarray], labels: Array, train: bool, rng: Any, step: int, origin: float):
        self.xs, self.labels, self.train, self.rng, self.step = xs, labels, train, rng, step
        self.nchw: set[str] = set()  # the inputs staged as float32 NCHW maps, transposed on the device
        self.blocks: dict[Key, Any] = {}
        self.loss: float | None = None  # read from the pinned staging buffer once the step has run
        self.logits: np.ndarray | None = None
        self.timeline = Timeline(origin=origin)
        self.staged: Any = None  # the pinned buffer holding the batch for the step's uploads
        self.batch: dict[str, np.ndarray] = {}
        self.loss_ok: Any = None  # the loss is finite (a device scalar, set by the loss step)
        self.skipped = False  # read from ``ok`` once the step has run: the loss or a gradient was not finite
        #: the step's finite flag, a bool array of one value on the device, made by its first update for
        #: every bucket: the fused updates read it there (the host never waits for it inside the step)
        self.ok: Any = None
        self.scale: float | None = None  # the loss scale (fp16 training), None: not scaled
        #: a micro-batch's share of its step's loss (its samples over the step's), None: the whole step
        self.share: float | None = None
        self.check = False  # look at every op's output for NaN or infinity (a diagnosis, slow)
        self.kept_stats: list[Any] = []  # batch norm's running statistics as they were before the step
        self.first_nonfinite: str | None = None
        self.reduced: dict[int, Any] = {}  # gradient bucket -> the event its all-reduce ends with
        #: the step is being recorded as a CUDA graph: its spans are not timed (no timing event in a capture)
        self.graphed = False
        self.entered = origin  # when the caller asked for the step (its seconds are counted from there)
        self.spilled: list[tuple[str, int, int]] = []  # encodings kept in host memory (see StepReport.spilled)
        #: the transfers' state (:class:`~vmem.runtime.transfers.Transfers` fills it): buffers offloaded until
        #: their wait, every offload of the step, encodings kept on the device by buffer key
        self.offloaded: dict[Key, Any] = {}
        self.sent: list[Any] = []
        self.encodings: dict[Key, Any] = {}


def _check_runs(device: Device, schedule: Schedule) -> None:
    """A DeviceError where ``device`` cannot run ``schedule``: it holds no data (a simulated GPU), or a codec
    the schedule uses runs on another device only."""
    if not device.holds_data:
        raise DeviceError(f"{device.name} holds no data: it plans (vmem.plan) but cannot run a step")
    refused = sorted(
        {
            st.codec.spec
            for st in schedule.steps
            if isinstance(st, (Encode, Decode, Offload, Prefetch))
            and st.codec is not None
            and not device.runs_codec(st.codec)
        }
    )
    if refused:
        raise DeviceError(
            f"{device.name}: codec {', '.join(refused)} runs on the CPU device only in this "
            "version of vmem (on a GPU: zvc, ssdc, binarize, dpr)"
        )


class Executor:
    """Runs one Schedule (training or inference) on a device."""

    def __init__(
        self,
        device: Device,
        schedule: Schedule,
        params: DeviceParams,
        loss: Any = None,
        optimizer: Optimizer | None = None,
        group: ProcessGroup | None = None,
        comm_stream: Any = None,
        batch_group: Any = None,
    ):
        """``group`` (a :class:`vmem.distributed.ProcessGroup`) and ``comm_stream`` (the stream its
        all-reduces run on) where the schedule all-reduces gradients (data-parallel training);
        ``batch_group`` (a channel of the same ranks) where batch norm's statistics are the whole batch's
        (synchronized batch norm)."""
        _check_runs(device, schedule)
        self.device = device
        self.schedule = schedule
        self.program = program = schedule.program
        self.loss = loss
        self.optimizer = optimizer
        self.group, self.comm_stream = group, comm_stream
        self._batch_sum = None if batch_group is None else batch_group.allreduce
        #: each trainable parameter's gradient on the device, by "layer.param" (what an all-reduce sums)
        self._grads = {k.name: v for k, v in params.views.items() if k.kind is Kind.WEIGHT_GRAD}
        self._weights = {k.name: v for k, v in params.views.items() if k.kind is Kind.WEIGHT}
        self.xp = device.xp
        #: each input's (tensor, upload source, what it is stored in), the first first
        self._inputs = [
            (t, program.upload_source(t), np.dtype(program.tensors[t].dtype)) for t in program.input_tensors
        ]
        self._input_of = {source: t for t, source, _ in self._inputs}  # upload source -> its tensor
        self._loss_dtype = np.dtype(program.loss_dtype)  # the loss's and its probabilities' (float32 over half logits)
        self._grad_dtype = np.dtype(program.precision.gradients)  # the weights' gradients
        #: each tensor is viewed in what it is stored in (a layer may store its output otherwise)
        self._dtypes = {t.dtype: np.dtype(t.dtype) for t in program.tensors}
        self._params = params
        ops = program.ops
        # Per-op views that never change: parameters and their gradients.
        self._op_params = [{k: params.views[Key(Kind.WEIGHT, op.param_key(k))] for k in op.params} for op in ops]
        self._op_grads = [
            {k: params.views[Key(Kind.WEIGHT_GRAD, op.param_key(k))] for k, s in op.params.items() if s.trainable}
            for op in ops
        ]
        #: the optimizer's side of the step: the parameters this process updates, the finite check, batch
        #: norm's statistics kept aside (see :class:`~vmem.runtime.update.Updates`)
        self._updates = Updates(device, schedule, params, optimizer)
        #: work runs after launch returns (a GPU): spans are timed by events, streams wait on the device
        self._asynchronous = bool(device.asynchronous)
        #: there, a float32 image batch is staged as it is (NCHW) and transposed and cast on the device by one
        #: kernel: the host only copies it (its own transpose and cast took 43.5 ms for 64 x 3 x 224 x 224)
        self._device_transpose = bool(device.nchw_inputs)
        #: per input staged that way, its float32 NCHW copy on the device: made at its first upload, outside the
        #: plan (in the reserve, as the finite check's tables), so that every step copies to the same place
        self._nchw: dict[str, Array] = {}
        #: pinned host arrays the caller fills with the next batches' input while a step runs (input_ring)
        self._ring: list[tuple[Block, np.ndarray]] = []
        # the batch staged in one pinned buffer: each input, then the labels, each at an aligned offset
        self._staging_layout(program, device.pool.alignment)
        self._has_loss = any(type(st) is Loss for st in schedule.steps)
        #: the loss's arrays (and its finite flag), on the device once, outside the plan (a few bytes a row), so
        #: that the loss asks the array module for nothing a step (a captured step allocates nothing)
        self._loss_work = self._loss_flag = None
        if self._has_loss and isinstance(loss, SoftmaxCrossEntropy):
            logits = physical(program.tensors[program.output].shape)
            self._loss_work = LossWork.make(self.xp, tuple(logits), self._loss_dtype)
            self._loss_flag = self.xp.empty(1, np.bool_)
        self._op_tables(program, schedule)
        #: convolutions that run the ReLU over their output, and those ReLUs (Schedule.fused_relu)
        fused = schedule.fused_relu
        self._relu_fused, self._relu_done = frozenset(fused), frozenset(fused.values())
        #: max pools that run the backward of the ReLU before them, and those ReLUs (Schedule.fused_pool_relu)
        self._pool_relu = schedule.fused_pool_relu
        self._relu_in_pool = frozenset(self._pool_relu.values())
        #: views of device blocks, by (offset, block size, shape, dtype): a planned schedule puts each
        #: buffer at the same place every step, and making an array costs the host more than finding it
        self._views: dict[tuple, Any] = {}
        self._views_max = 8 * len(schedule.steps) + 64
        #: training steps replayed as CUDA graphs, where the device records them (vmem.runtime.graphs)
        self.graphs = StepGraphs(program.network) if device.graphs else None
        #: the offloads, prefetches and encodings (what the step's Offload ... Decode steps are handed to)
        self._transfers = Transfers(device, self._op_params, self._block_view, self._view, self._launch)
        self._table = self._handlers()

    def _staging_layout(self, program: Program, a: int) -> None:
        """Where each input, the labels, the loss and the update's scalars sit in the step's pinned staging
        buffer (each at an ``a``-aligned offset), and its bytes."""
        self._inputs_at, at = [], 0
        for t in program.input_tensors:
            self._inputs_at.append(at)
            spec = program.tensors[t]
            nchw = 4 * int(np.prod(spec.shape)) if len(spec.shape) == 4 and self._device_transpose else 0
            at += -(-max(spec.nbytes, nchw, 1) // a) * a
        self._labels_at = at
        self._loss_at = self._labels_at + -(-int(np.prod(program.label_shape)) * 8 // a) * a
        self._scalars_at = self._loss_at + a  # the loss, copied there on the compute stream
        #: and the optimizer's scalars for its fused update, copied to the device in the step
        self._staging_bytes = self._scalars_at + -(-step_kernels.UPDATE_SCALARS * 4 // a) * a

    def _op_tables(self, program: Program, schedule: Schedule) -> None:
        """What each op's passes read that no step changes: its saved state's dtypes, its staged copies, each
        tensor's view and each op's static Ctx part."""
        ops = program.ops
        self._aux_dtype = {
            (op.index, k): (np.dtype(program.precision.master) if a.dtype == "float" else np.dtype(a.dtype))
            for op in ops
            for k, a in op.aux.items()
        }
        #: each staged op's float32 copies per pass: (role, input index, shape, aligned bytes)
        self._stage_items = {
            (op.index, p): [(role, j, shape, copy_nbytes(shape)) for role, j, shape in staged(program, op, p)]
            for op in ops
            if op.staged
            for p in ("forward", "backward")
        }
        #: each tensor's (physical shape, dtype): what its value's and its gradient's views are
        self._tensor_views = [(physical(spec.shape), self._dtypes[spec.dtype]) for spec in program.tensors]
        #: per op, what its Ctx holds that no step changes: the inputs' physical shapes, its saved state's
        #: (name, key, shape, dtype)
        self._op_static = [
            (
                tuple(physical(s) for s in op.in_shapes),
                [
                    (k, schedule.aux[(op.index, k)], tuple(a.shape), self._aux_dtype[(op.index, k)])
                    for k, a in op.aux.items()
                ],
            )
            for op in ops
        ]

    def _handlers(self) -> Any:
        """The handler of each kind of schedule step."""
        return handlers(
            {
                Alloc: self._alloc,
                Free: self._free,
                Upload: self._upload,
                Forward: self._forward,
                Recompute: self._forward,
                Loss: self._loss,
                Backward: self._backward,
                Accumulate: self._accumulate,
                AccumulateParam: self._accumulate_param,
                Update: self._update,
                AllReduce: self._allreduce,
                WaitAllReduce: self._wait_allreduce,
                Broadcast: self._broadcast,
                Offload: self._transfers.offload,
                Release: self._transfers.release,
                Prefetch: self._transfers.prefetch,
                WaitPrefetch: self._transfers.wait_prefetch,
                Encode: self._transfers.encode,
                Decode: self._transfers.decode,
                CopyOut: self._copy_out,
            },
            "executor",
        )

    # -- one step ----------------------------------------------------------------------------------
    @property
    def running_stats(self) -> list[Array]:
        """What a training forward changes besides the weights (batch norm's running statistics): their views
        on the device (none where the executor has no optimizer)."""
        return self._updates.stats

    def host_batch(self, x: np.ndarray | Sequence[np.ndarray]) -> "HostBatch":
        """The batch ``x`` (its array, or one per input of the network, in the order of ``net.inputs``) as a
        step uploads it: maps channels last, each in its input's dtype. :meth:`run` takes it as it takes
        ``x``; made ahead (a micro-batched step makes every micro-batch's before the first runs), the host's
        transposes and casts stay out of the step."""
        arrays = list(x) if isinstance(x, (tuple, list)) else [x]
        if len(arrays) != len(self._inputs):
            raise ValueError(f"{self.program.network}: {len(arrays)} input arrays for {len(self._inputs)} inputs")
        out, nchw = [], []
        for a, (_, _, dtype) in zip(arrays, self._inputs):
            if is_device_array(a):  # already on the device (Trainer.step took a device array): transposed there
                out.append(a)
                nchw.append(False)
                continue
            a = np.asarray(a)
            on_device = self._device_transpose and a.ndim == 4 and a.dtype == np.float32
            nchw.append(on_device)
            if on_device:  # copied as it is, transposed and cast on the device
                out.append(np.ascontiguousarray(a))
            else:
                out.append(np.ascontiguousarray(a.transpose(0, 2, 3, 1) if a.ndim == 4 else a, dtype=dtype))
        return HostBatch(out, nchw)

    def run(
        self,
        x: "np.ndarray | Sequence[np.ndarray] | HostBatch",
        labels: np.ndarray | None,
        *,
        train: bool,
        rng: np.random.Generator,
        step: int = 0,
        check: bool = False,
        loss_scale: float | None = None,
        share: float | None = None,
    ) -> tuple[StepReport, np.ndarray | None]:
        """Run the schedule on one batch (``x``: its array, or one array per input of a network of several,
        in the order of ``net.inputs``). Returns the report and, for inference, the logits (NCHW order).

        A training step whose loss or gradients are not all finite changes nothing: the update is skipped
        and batch norm's running statistics are put back (``report.skipped``). With ``check``, every op's
        output is looked at as the step runs, and ``report.first_nonfinite`` names the first that is not
        finite (a diagnosis: each look waits for the op). ``loss_scale`` (fp16 training, see
        :class:`vmem.optim.GradScaler`) multiplies the loss's gradient; the weights' gradients are divided by
        it before the update, and a step whose scaled gradients overflow is skipped as any non-finite one.
        ``share``: this batch is a micro-batch of a step (:class:`vmem.runtime.MicroBatched`), its loss's
        gradient weighed by its share of the step's samples. One step at a time on a device: a thread that
        asks for a step while another thread's runs there is refused (RuntimeError), not queued."""
        entered = time.perf_counter()  # the step's clock: what the caller waits, the batch's host work included
        lock = _stepping(self.device)
        if not lock.acquire(blocking=False):
            raise RuntimeError(
                f"{self.program.network}: another thread is running a step on {self.device.name}; step a Trainer "
                "from one thread at a time (or give each thread its own Trainer and device)"
            )
        try:
            return self._run(
                x, labels, train=train, rng=rng, step=step, check=check, loss_scale=loss_scale, share=share, at=entered
            )
        finally:
            lock.release()

    def _run(
        self,
        x: "np.ndarray | Sequence[np.ndarray] | HostBatch",
        labels: np.ndarray | None,
        *,
        train: bool,
        rng: np.random.Generator,
        step: int,
        check: bool,
        loss_scale: float | None,
        share: float | None,
        at: float | None = None,
    ) -> tuple[StepReport, np.ndarray | None]:
        dev, pool = self.device, self.device.pool
        batch = x if isinstance(x, HostBatch) else self.host_batch(x)
        host_xs = batch.arrays
        # before the step: no pinned allocation inside it (the offloads' buffers, and the batch's staging)
        dev.reserve_pinned(self.schedule.pinned_bytes + self._staging_bytes)
        pool.reset_peak()
        r = _Run(host_xs, labels, train, rng, step, time.perf_counter())
        r.entered = r.timeline.origin if at is None else at
        r.nchw = {source for (_, source, _), flag in zip(self._inputs, batch.nchw) if flag}
        r.check = check
        r.scale = None if loss_scale is None or loss_scale == 1 else float(loss_scale)
        r.share = None if share is None or share == 1 else float(share)
        key, why = self._graph_key(r)
        if key is not None:
            assert self.graphs is not None
            rec = self.graphs.replayable(key, pool_state(pool), pool_state(self._transfers.pinned))
            if rec is not None:
                report = self._replay(r, rec)
                if report is not None:
                    return report, None
        capture = key is not None and self.graphs is not None and self.graphs.should_capture(key)
        if self._asynchronous:  # spans timed by events: measured from this one
            r.timeline.start(dev.compute_stream.record(timing=True))
        r.timeline.sample(r.timeline.origin, dev.readings())
        self._transfers.begin(r)
        graph = None
        try:
            self._stage(r)
            with dev.step_scope() as threads:
                walk = time.perf_counter()
                if capture:
                    graph = self._capture(r, key)
                    graph.launch(dev.compute_stream)
                else:
                    self._walk(r)
                walk = time.perf_counter() - walk
                dev.synchronize()
                if graph is not None:
                    graph.ran()
                if self.comm_stream is not None:
                    self.comm_stream.synchronize()  # a failed collective: raised here
            r.timeline.resolve()
            if r.ok is not None:  # the step has run: its finite flag is read once, after it, explicitly
                r.skipped = not r.ok.item()
            if self._has_loss:  # the step has run: the loss's copy has landed
                r.loss = float(r.batch["loss"][0])
            staged = r.staged.offset
            self._unstage(r)
            r.timeline.sample(time.perf_counter(), dev.readings())
            moved = self._transfers.moved(r)
            pool.reclaim()  # every event has completed: coalesce, so each step starts as the plan's replay does
        except _Uncaptured:
            self._roll_back(r)
            return self._run(
                x, labels, train=train, rng=rng, step=step, check=check, loss_scale=loss_scale, share=share, at=at
            )
        except BaseException:
            if graph is not None:
                graph.close()
            self._roll_back(r)
            raise
        timeline = r.timeline
        timeline.math = dev.spec.math  # how FP32 convolutions computed (tf32 or exact)
        if r.scale is not None:
            timeline.marks.update(loss_scale=float(r.scale), skipped=bool(r.skipped))
        peak, average = pool.peak, timeline.average_bytes(pool.in_use)
        if self.graphs is not None:
            if graph is not None:  # no span was timed: the measures are those of the same step run as it is
                peak, average = self.graphs.measured(key) or (peak, average)
                self.graphs.keep(
                    Recorded(
                        key,
                        graph,
                        r.ok,
                        pool_state(pool),
                        pool_state(self._transfers.pinned),
                        staged,
                        peak,
                        average,
                        moved,
                    )
                )
            else:
                self.graphs.ran_as_is(key, why, peak, average)
        report = StepReport(
            loss=r.loss if r.loss is not None else float("nan"),
            seconds=time.perf_counter() - r.entered,
            peak_bytes=peak,
            average_bytes=average,
            offloaded_bytes=moved,
            stall_seconds=timeline.stall_seconds,
            timeline=timeline,
            threads=threads,
            skipped=r.skipped,
            first_nonfinite=r.first_nonfinite,
            loss_scale=r.scale,
            dispatch_seconds=walk,
            spilled=tuple(r.spilled),
            graph="captured" if graph is not None else "",
        )
        logits = r.logits
        if logits is not None and logits.dtype != self._loss_dtype:  # half logits: given back as the loss read them
            logits = logits.astype(self._loss_dtype)
        if logits is not None and logits.ndim == 4:  # an output map, given back in NCHW order
            logits = np.ascontiguousarray(logits.transpose(0, 3, 1, 2))
        return report, logits

    def _walk(self, r: _Run) -> None:
        """Enqueue the step: batch norm's statistics kept aside (put back if the step is skipped), then every
        step of the schedule, each through its handler."""
        if r.train and self._updates.stats:
            self.device.compute_stream.launch(self._updates.keep(r))
        with self.device.dispatch_scope():
            for st in self.schedule.steps:
                self._table[type(st)](r, st)

    # -- CUDA graphs (vmem.runtime.graphs) ---------------------------------------------------------
    def _graph_key(self, r: _Run) -> tuple[Hashable | None, str | None]:
        """(what a graph of this step bakes in, None where it cannot be one; why not)."""
        if self.graphs is None:
            return None, None
        why = self.graphs.eligible(
            train=r.train,
            check=r.check,
            device_input=any(is_device_array(a) for a in r.xs),
            collectives=self.group is not None or self.comm_stream is not None or self._batch_sum is not None,
        )
        if why is not None:
            return None, why
        fused = self._updates.fused(r.step)
        scalars = None if fused is None else fused[0]  # its scalars are read from the staging, not baked in
        shapes = tuple((a.shape, a.dtype.str) for a in r.xs)
        labels = None if r.labels is None else np.shape(r.labels)
        return (r.train, r.scale, r.share, shapes, labels, scalars), None

    def _capture(self, r: _Run, key: Hashable) -> Graph:
        """Record the step as a graph (none of it runs); a capture that fails is dropped (_Uncaptured)."""
        assert self.graphs is not None
        r.graphed = True
        # the host's draws for the step (dropout's masks) are made again when it runs as it is
        drawn = r.rng.bit_generator.state if r.rng is not None else None
        try:
            with self.device.capture() as cap:
                self._walk(r)
        except Exception as exc:  # noqa: BLE001 - whatever the capture refused, the step runs as it is
            if drawn is not None:
                r.rng.bit_generator.state = drawn
            self.graphs.ran_as_is(key, self.graphs.refuse(key, exc))
            raise _Uncaptured() from exc
        assert cap.graph is not None  # the capture ended without an error
        return cap.graph

    def _replay(self, r: _Run, rec: Recorded) -> StepReport | None:
        """The step as one launch of its graph, the batch staged where the graph reads it; None (nothing
        done) where the staging buffer fell elsewhere."""
        dev = self.device
        cs = dev.compute_stream
        self._stage(r)
        if r.staged.offset != rec.staged:
            self._unstage(r)
            assert self.graphs is not None
            self.graphs.drop()
            return None
        try:
            walk = time.perf_counter()
            start = cs.record(timing=True)
            r.timeline.start(start)
            rec.graph.launch(cs)
            r.timeline.pending("graph", cs.name, "compute", dev.pool.usage(), start, cs.record(timing=True))
            walk = time.perf_counter() - walk
            dev.synchronize()
            r.timeline.resolve()
            r.skipped = rec.ok is not None and not rec.ok.item()
            if self._has_loss:
                r.loss = float(r.batch["loss"][0])
        finally:
            self._unstage(r)
        timeline = r.timeline
        timeline.math = dev.spec.math
        if r.scale is not None:
            timeline.marks.update(loss_scale=float(r.scale), skipped=bool(r.skipped))
        return StepReport(
            loss=r.loss if r.loss is not None else float("nan"),
            seconds=time.perf_counter() - r.entered,
            peak_bytes=rec.peak,
            average_bytes=rec.average,
            offloaded_bytes=rec.moved,
            timeline=timeline,
            skipped=r.skipped,
            loss_scale=r.scale,
            dispatch_seconds=walk,
            graph="replayed",
        )

    def _roll_back(self, r: _Run) -> None:
        """Return every block and pinned buffer the failed step holds, then let its streams drain."""
        cs = self.device.compute_stream
        for block in r.blocks.values():
            self.device.pool.free(block, cs)
        self._transfers.release_all(r)
        try:
            self.device.synchronize()
        except BaseException:
            pass  # the original error is the one to report
        self._unstage(r)

    # -- streams -----------------------------------------------------------------------------------
    def _launch(self, r: _Run, name: str, fn: Any, *args: Any, kind: str = "compute") -> None:
        """Enqueue ``fn`` on the compute stream as a timed span."""
        span(self._asynchronous, r, self.device.compute_stream, name, kind, self.device.pool.usage(), fn, *args)

    # -- memory ------------------------------------------------------------------------------------
    def _alloc(self, r: _Run, st: Alloc) -> None:
        buf = st.buffer
        r.blocks[buf.key] = self.device.pool.allocate(
            buf.nbytes, self.device.compute_stream, buf.category, high=buf.high, offset=st.offset
        )

    def _free(self, r: _Run, st: Free) -> None:
        self.device.pool.free(r.blocks.pop(st.key), self.device.compute_stream)

    # -- the input ring ----------------------------------------------------------------------------
    def input_ring(self, slots: int = 2) -> list[np.ndarray] | None:
        """``slots`` pinned host arrays of the step's input (float32 NCHW) that a caller fills with the next
        batches while a step runs (``Trainer.fit`` gathers each batch into one on a thread of its own); a
        step given one of them uploads it from there as it is, with no copy on the host. Only on a device
        that works after ``launch`` returns and uploads a float32 image batch as it is, for a network of one
        such input, and not where steps replay as CUDA graphs (a graph bakes its upload's address); None
        elsewhere, or where the pinned pool cannot hold them. Held until :meth:`release_ring`."""
        if self._ring:
            return [view for _, view in self._ring]
        shape = tuple(self.program.tensors[self.program.input_tensors[0]].shape)
        if not (self._asynchronous and self._device_transpose) or self.graphs is not None:
            return None
        if len(self._inputs) != 1 or len(shape) != 4:
            return None
        nbytes = 4 * int(np.prod(shape))
        a = self.device.pool.alignment
        try:
            self.device.reserve_pinned(self.schedule.pinned_bytes + self._staging_bytes + slots * -(-nbytes // a) * a)
            for _ in range(slots):
                block = self._transfers.pinned.allocate(nbytes, "other", high=True)
                self._ring.append((block, self.device.host_view(block, shape, np.float32)))
        except MemoryError:  # the pinned pool is fixed and busy, or too small: the step stages as it does
            self.release_ring()
            return None
        return [view for _, view in self._ring]

    def release_ring(self) -> None:
        """Give the input ring's pinned arrays back (the steps that read them have completed)."""
        ring, self._ring = self._ring, []
        for block, _ in ring:
            self._transfers.pinned.free(block)

    def _in_ring(self, x: np.ndarray) -> bool:
        return any(view.ctypes.data == x.ctypes.data and view.shape == x.shape for _, view in self._ring)

    def _stage(self, r: _Run) -> None:
        """The batch (input, labels) copied into one pinned buffer at the top of the pinned arena, held for
        the step. A copy from pageable memory first waits for everything enqueued before it (CUDA's rule,
        which the CPU device keeps): a layer-wise schedule allocates the labels just before the loss, and
        the host would wait there for the whole forward, then enqueue the backward while it runs."""
        dev = self.device
        r.staged = self._transfers.pinned.allocate(self._staging_bytes, "other", high=True)
        raw = dev.host_view(r.staged, (r.staged.nbytes,), np.uint8)
        r.batch = {}
        for x, (_, source, _), at in zip(r.xs, self._inputs, self._inputs_at):
            if is_device_array(x) or (self._ring and self._in_ring(x)):  # uploaded from where it is (_upload)
                r.batch[source] = x
                continue
            r.batch[source] = raw[at : at + x.nbytes].view(x.dtype).reshape(x.shape)
            np.copyto(r.batch[source], x)
        if r.labels is not None:
            labels = np.asarray(r.labels, dtype=np.int64)
            at = self._labels_at
            r.batch["labels"] = raw[at : at + labels.nbytes].view(np.int64).reshape(labels.shape)
            np.copyto(r.batch["labels"], labels)
        loss = self._loss_dtype
        r.batch["loss"] = raw[self._loss_at : self._loss_at + loss.itemsize].view(loss)
        r.batch["scalars"] = raw[self._scalars_at : self._scalars_at + step_kernels.UPDATE_SCALARS * 4].view(np.float32)
        self._updates.stage(r.step, r.batch["scalars"])

    def _unstage(self, r: _Run) -> None:
        if r.staged is not None:
            self._transfers.pinned.free(r.staged)
            r.staged = None

    def _upload(self, r: _Run, st: Upload) -> None:
        if st.source == "labels":
            dst = self._labels(r)
        else:
            dst = self._value(r, self._input_of[st.source])
        src = r.batch[st.source]
        cs = self.device.compute_stream
        if st.source in r.nchw:  # float32 NCHW in pinned memory: copied whole, transposed and cast on the device
            tmp = self._nchw.get(st.source)
            if tmp is None or tmp.shape != src.shape:
                tmp = self._nchw[st.source] = self.device.xp.empty(src.shape, np.float32)
            self.device.copy_to_device(tmp, src, stream=cs)
            cs.launch(self._transposed, tmp, dst)
            return
        if is_device_array(src):  # a device array (NCHW, any type): transposed and cast by one kernel on the device
            if src.ndim == 4 and src.dtype == np.float32 and src.flags.c_contiguous:
                cs.launch(self._transposed, src, dst)
                return
            made = src.transpose(0, 2, 3, 1) if src.ndim == 4 else src
            cs.launch(self.device.xp.copyto, dst, made, casting="unsafe")
            return
        self.device.copy_to_device(dst, src, stream=cs)

    def _transposed(self, src: Array, dst: Array) -> None:
        """``dst`` (N, H, W, C) = ``src`` (float32 N, C, H, W) in ``dst``'s type: vmem's kernel where it is
        built for the device, else the array module's copy."""
        on = native.backend(dst)
        if on is not None and np.dtype(dst.dtype).name in ("float32", "float16", "bfloat16"):
            step_kernels.nchw_to_nhwc(src, dst, on)
        else:
            self.device.xp.copyto(dst, src.transpose(0, 2, 3, 1), casting="unsafe")

    def _copy_out(self, r: _Run, st: CopyOut) -> None:
        t = self.program.tensors[st.tensor]
        r.logits = np.empty(physical(t.shape), self._dtypes[t.dtype])  # as stored: (N, H, W, C) for a map
        self.device.copy_to_host(r.logits, self._value(r, st.tensor), stream=self.device.compute_stream)

    # -- views -------------------------------------------------------------------------------------
    def _view(self, r: _Run, key: Key, shape: tuple, dtype: DTypeLike) -> Array:
        return self._block_view(r.blocks[key], shape, dtype)

    def _block_view(self, block: Block, shape: tuple, dtype: DTypeLike) -> Array:
        """An array of ``shape`` and ``dtype`` over ``block`` (a live block of the device pool), made once
        per place: the arena never moves, so a view at the same offset of a block of the same size is the
        same array."""
        k = (block.offset, block.size, shape, dtype)
        v = self._views.get(k)
        if v is None:
            if len(self._views) >= self._views_max:  # placements that keep changing (best fit): start over
                self._views.clear()
            v = self._views[k] = self.device.view(block, shape, dtype)
        return v

    def _value(self, r: _Run, tensor: int) -> Array:
        shape, dtype = self._tensor_views[tensor]
        return self._block_view(r.blocks[self.schedule.value[tensor]], shape, dtype)

    def _grad(self, r: _Run, tensor: int) -> Array:
        shape, dtype = self._tensor_views[tensor]  # a gradient is stored as its tensor is
        return self._block_view(r.blocks[self.schedule.grad[tensor]], shape, dtype)

    def _labels(self, r: _Run) -> Array:
        return self._view(r, _LABELS, self.program.label_shape, np.int64)

    def _ctx(
        self, r: _Run, i: int, train: bool, rng: Any, algo: Any, workspace: Key | None, replay: bool = False
    ) -> Ctx:
        in_shapes, aux_views = self._op_static[i]
        blocks = r.blocks
        aux = {k: self._block_view(blocks[key], shape, dtype) for k, key, shape, dtype in aux_views}
        if workspace is not None:
            block = blocks[workspace]
            ws = self._block_view(block, (block.nbytes,), _BYTE)
        else:
            ws = None
        return Ctx(
            xp=self.xp,
            params=self._op_params[i],
            grads=self._op_grads[i],
            aux=aux,
            train=train,
            rng=rng,
            workspace=ws,
            algo=algo,
            in_shapes=in_shapes,
            conv=self.device.conv_backend,
            ops=self.device.ops,
            replay=replay,
            batch_sum=self._batch_sum if train else None,
        )

    # -- ops ---------------------------------------------------------------------------------------
    def _forward(self, r: _Run, st: Forward | Recompute) -> None:
        """A forward, or its replay during backward (the layer reuses its saved state, updates nothing). A
        ReLU its convolution runs (``Schedule.fused_relu``) does nothing here."""
        if st.op in self._relu_done:
            return
        op = self.program.ops[st.op]
        replay = type(st) is Recompute
        ctx = self._ctx(r, st.op, r.train or replay, r.rng, st.algo, st.workspace, replay=replay)
        ctx.relu = st.op in self._relu_fused
        xs = [self._value(r, t) for t in op.inputs]
        y = self._value(r, op.output)
        fn = (
            op.layer.forward
            if not op.staged
            else staged_forward(op.layer.forward, self._stage_items[(st.op, "forward")], ctx)
        )
        self._launch(
            r,
            f"{op.name}.recompute" if replay else op.name,
            fn,
            ctx,
            xs,
            y,
            kind="recompute" if replay else "compute",
        )
        if r.check:
            self._check(r, f"{op.name} (forward)", [y])

    def _backward(self, r: _Run, st: Backward) -> None:
        """An op's backward (a ReLU its max pool runs, ``Schedule.fused_pool_relu``, does nothing here)."""
        if st.op in self._relu_in_pool:
            return
        op = self.program.ops[st.op]
        sched = self.schedule
        ctx = self._ctx(r, st.op, True, None, st.algos, st.workspace)
        if st.op in self._pool_relu:
            ctx.relu_output = self._value(r, self.program.ops[self._pool_relu[st.op]].output)
        temps = sched.param_acc.get(st.op) if st.part != "data" else None  # data: no weight gradient
        if temps:  # a shared parameter used again (or a micro-batch's): its contribution goes to a temporary
            ctx.grads = {k: self._view(r, key, ctx.grads[k].shape, self._grad_dtype) for k, key in temps.items()}
        dy = self._grad(r, op.output)
        if st.on_bits is not None:  # ReLU's backward on the bits of its binarized output (Gist)
            if sched.needs_grad[op.inputs[0]]:
                self._transfers.relu_on_bits(r, f"{op.name}.backward", st.on_bits, dy, self._grad(r, op.inputs[0]))
            return
        # a split convolution (Backward.part): the weights' gradients from x and dy, then x's from dy and w
        filter_only, data_only = st.part == "filter", st.part == "data"
        if data_only:
            ctx.grads = {}
        xs = [self._value(r, t) for t in op.inputs] if op.reads_input and not data_only else None
        y = self._value(r, op.output) if op.reads_output else None
        dxs: list[Array] = []
        for j, t in enumerate(op.inputs):
            if filter_only or not sched.needs_grad[t]:
                dxs.append(None)
            elif (st.op, j) in sched.acc:
                tensor = self.program.tensors[t]
                dxs.append(self._view(r, sched.acc[(st.op, j)], physical(tensor.shape), self._dtypes[tensor.dtype]))
            else:
                dxs.append(self._grad(r, t))
        fn = (
            op.layer.backward
            if not op.staged
            else staged_backward(op.layer.backward, self._stage_items[(st.op, "backward")], ctx)
        )
        name = f"{op.name}.backward" if st.part == "all" else f"{op.name}.backward_{st.part}"
        self._launch(r, name, fn, ctx, dy, xs, y, dxs)
        if r.check:
            self._check(r, f"{op.name} (backward)", [d for d in dxs if d is not None] + list(ctx.grads.values()))

    def _check(self, r: _Run, name: str, arrays: list[Array]) -> None:
        """Record ``name`` as the step's first non-finite output if any of ``arrays`` is not finite, once
        the work before it has run (a diagnosis: on a GPU the host waits here)."""
        xp = self.xp

        def look() -> None:
            if r.first_nonfinite is None and not all(bool(xp.isfinite(a.sum(dtype=np.float64))) for a in arrays):
                r.first_nonfinite = name

        self.device.compute_stream.launch(look)

    def _accumulate(self, r: _Run, st: Accumulate) -> None:
        g = self._grad(r, st.tensor)
        tmp = self._view(r, st.temp, g.shape, g.dtype)
        self._launch(r, f"acc:{self.program.tensors[st.tensor].name}", np.add, g, tmp, g)

    def _accumulate_param(self, r: _Run, st: AccumulateParam) -> None:
        g = self._params.views[Key(Kind.WEIGHT_GRAD, st.param)]
        tmp = self._view(r, st.temp, g.shape, g.dtype)
        self._launch(r, f"acc:{st.param}", np.add, g, tmp, g)

    def _loss(self, r: _Run, st: Loss) -> None:
        prog = self.program
        logits = self._value(r, prog.output)
        value = self._view(r, _LOSS, (1,), self._loss_dtype)
        labels = self._labels(r)
        if st.inplace:
            probs = dlogits = logits
        else:
            probs = self._view(r, _PROBS, logits.shape, self._loss_dtype)
            dlogits = self._grad(r, prog.output)
        loss, xp, host = self.loss, self.xp, r.batch["loss"]
        copy = self.device.copy_now if self._asynchronous else None
        scale = r.scale
        factor = None if scale is None and r.share is None else (scale or 1.0) * (r.share or 1.0)
        # half logits (mixed precision): the gradient is made and scaled in float32 over the
        # probabilities, then rounded once into d(logits), so that scaling comes before any underflow
        narrow = dlogits.dtype != probs.dtype

        more, flag = (() if self._loss_work is None else (self._loss_work,)), self._loss_flag  # its arrays

        def run() -> None:  # the value stays on the device; its copy lands in pinned memory, read after the step
            grad = probs if narrow else dlogits
            value[...] = loss.forward(xp, logits, labels, probs, *more)  # a device copy: no host read
            # a device scalar: the update looks at it
            r.loss_ok = xp.isfinite(value[0]) if flag is None else xp.isfinite(value, out=flag)
            loss.backward(xp, probs, labels, grad, *more)
            if factor is not None:
                xp.multiply(grad, grad.dtype.type(factor), out=grad)
            if narrow:
                dlogits[...] = probs
            if copy is not None:
                copy(host, value, "d2h")  # enqueued on the compute stream: the host does not wait
            else:
                np.copyto(host, value)

        self._launch(r, "loss", run)

    def _update(self, r: _Run, st: Update) -> None:
        self._launch(r, "update", self._updates.work(r, st))

    def _allreduce(self, r: _Run, st: AllReduce) -> None:
        """Sum the bucket's gradients over the ranks on the communication stream once the compute stream has
        written them, then divide them by the number of ranks (the whole batch's mean)."""
        group, comm = self._collective("all-reduces gradients")
        grads = [self._grads[name] for name in st.params]
        size = group.size

        def run() -> None:  # on the communication stream (NCCL's collectives enqueue on it)
            group.allreduce_many(grads)
            for g in grads:
                g /= g.dtype.type(size)

        comm.wait(self.device.compute_stream.record())
        span(self._asynchronous, r, comm, f"allreduce{st.bucket}", "comm", self.device.pool.usage(), run)
        r.reduced[st.bucket] = comm.record()

    def _broadcast(self, r: _Run, st: Broadcast) -> None:
        """Each updated weight from the rank that updated it to the others, on the communication stream once
        the updates are done (the step ends when it has)."""
        group, comm = self._collective("broadcasts weights")
        weights = [(self._weights[name], owner) for name, owner in st.params]

        def run() -> None:
            group.broadcast_many(weights)

        comm.wait(self.device.compute_stream.record())
        span(self._asynchronous, r, comm, "broadcast", "comm", self.device.pool.usage(), run)
        self.device.compute_stream.wait(comm.record())

    def _collective(self, what: str) -> tuple[Any, Any]:
        """The group and the communication stream a collective step runs with."""
        if self.group is None or self.comm_stream is None:
            raise DeviceError(f"{self.program.network}: the schedule {what}; give the executor a group")
        return self.group, self.comm_stream

    def _wait_allreduce(self, r: _Run, st: WaitAllReduce) -> None:
        self.device.compute_stream.wait(r.reduced.pop(st.bucket))
