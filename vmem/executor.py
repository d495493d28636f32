"""The executor carries out a Schedule on a device. It decides nothing.

Allocation and frees happen on the host, in schedule order, against the device pool with the compute
stream (so reuse is stream-ordered); every op is enqueued on the compute stream and runs asynchronously.
Each op records its start and end time on the stream and the pool's usage while it ran: that is the
step's timeline, from which the time-weighted average usage is computed.

If anything fails during a step (an out-of-memory error, an error in a layer), every block the step
allocated is returned, so the pool is exactly as it was before the step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import codecs
from .codecs import transfer
from .graph import Program
from .nn.base import Ctx, physical
from .optim import Optimizer
from .policies.plan import Plan
from .schedule import Buffer, Schedule
from .timeline import Span, Timeline

__all__ = ["Executor", "DeviceParams", "StepReport"]


@dataclass
class StepReport:
    """What one training step did and used. Bytes are the device pool's (with fragmentation)."""

    loss: float
    seconds: float
    peak_bytes: int
    average_bytes: float
    offloaded_bytes: int = 0
    stall_seconds: float = 0.0
    timeline: Timeline = field(default_factory=Timeline, repr=False)

    @property
    def spans(self) -> list[Span]:
        return self.timeline.spans

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in
                ("loss", "seconds", "peak_bytes", "average_bytes", "offloaded_bytes", "stall_seconds")}


class DeviceParams:
    """Weights, weight gradients and optimizer state held in the device pool for a whole run."""

    def __init__(self, device: Any, buffers: list[Buffer], specs: dict[str, Any], dtype: str):
        self.device = device
        self.dtype = np.dtype(dtype)
        self.blocks: dict[str, Any] = {}
        self.views: dict[str, Any] = {}
        try:
            for buf in buffers:
                key = buf.name.split(":", 2)[1]
                block = device.pool.allocate(buf.nbytes, None, buf.category)
                self.blocks[buf.name] = block
                self.views[buf.name] = device.view(block, specs[key].shape, self.dtype)
        except BaseException:
            self.release()
            raise
        for name, view in self.views.items():
            if not name.startswith("w:"):
                view.fill(0)

    def upload(self, params: dict[str, np.ndarray]) -> None:
        for key, value in params.items():
            self.views[f"w:{key}"][...] = value

    def download(self) -> dict[str, np.ndarray]:
        return {name[2:]: np.array(v) for name, v in self.views.items() if name.startswith("w:")}

    def optimizer_state(self) -> dict[str, np.ndarray]:
        return {name[2:]: np.array(v) for name, v in self.views.items() if name.startswith("o:")}

    def load_optimizer_state(self, state: dict[str, np.ndarray]) -> None:
        for key, value in state.items():
            self.views[f"o:{key}"][...] = value

    def release(self) -> None:
        for block in self.blocks.values():
            self.device.pool.free(block)
        self.blocks.clear()
        self.views.clear()


def _timed(timeline: Timeline, name: str, stream: str, kind: str, usage: dict[str, int], fn: Any, *args: Any) -> None:
    """Run ``fn`` on a stream and record its span there (with the pool usage at its enqueue)."""
    start = time.perf_counter()
    fn(*args)
    timeline.record(Span(name, stream, kind, start, time.perf_counter(), sum(usage.values()), usage))


class _Offloaded:
    """A buffer sent to pinned host memory: where it is, its encoding there (if a codec is set, filled
    in by the memory stream), the bytes that crossed the bus, and the events of its copies."""

    __slots__ = ("host_block", "host", "done", "back", "enc", "moved")

    def __init__(self, host_block: Any, host: Any):
        self.host_block = host_block
        self.host = host
        self.done: Any = None  # event after the device-to-host copy
        self.back: Any = None  # event after the host-to-device copy
        self.enc: Any = None
        self.moved = 0


class Executor:
    """Runs one Schedule (training or inference) of a Program on a device."""

    def __init__(self, device: Any, program: Program, plan: Plan, schedule: Schedule, params: DeviceParams,
                 loss: Any = None, optimizer: Optimizer | None = None):
        self.device = device
        self.program = program
        self.plan = plan
        self.schedule = schedule
        self.params = params
        self.loss = loss
        self.optimizer = optimizer
        self.xp = device.xp
        self.dtype = np.dtype(program.dtype)
        ops = program.ops
        # Per-op views that never change: parameters and their gradients.
        self._op_params = [{k: params.views[f"w:{op.name}.{k}"] for k in op.params} for op in ops]
        self._op_grads = [{k: params.views[f"g:{op.name}.{k}"] for k, s in op.params.items() if s.trainable}
                          for op in ops]
        self._updates = [
            (params.views[f"w:{key}"], params.views[f"g:{key}"],
             {slot: params.views[f"o:{key}:{slot}"] for slot in (optimizer.slots if optimizer else ())})
            for key in (f"{op.name}.{k}" for op in ops for k, s in op.params.items() if s.trainable)
        ] if optimizer is not None else []
        # feature-map buffer -> (codec, physical shape) for the buffers the plan encodes or offloads with a codec
        owner = {schedule.value[t.buffer]: t.buffer for t in program.tensors}
        self._codecs = {name: (codecs.get(spec), physical(program.tensors[owner[name]].shape))
                        for name, spec in schedule.codecs.items()}
        # fixed-point buffers whose range comes from a batch norm's parameters: buffer -> (op index, relu, sigmas)
        index, ids = {op.name: op.index for op in ops}, {t.name: t.id for t in program.tensors}
        self._bn_ranges = {schedule.value[ids[name]]: (index[r["batchnorm"]], bool(r["relu"]), float(r["sigmas"]))
                           for name, r in plan.ranges.items()}
        self._host_bytes = {st[1]: self._host_nbytes(st[1]) for st in schedule.steps if st[0] == "offload"}
        self._pinned_bytes = sum(-(-n // 4096) * 4096 for n in self._host_bytes.values())  # with alignment
        # encodings whose size depends on the data are allocated when it is known (see _encode)
        self._deferred = {enc for name, enc in schedule.encoded.items() if self._codecs[name][0].data_dependent}
        self._timeline = Timeline()
        self._aux_dtype = {
            (op.index, k): (self.dtype if a.dtype == "float" else np.dtype(a.dtype)) for op in ops
            for k, a in op.aux.items()
        }

    # -- one step ----------------------------------------------------------------------------------
    def run(self, x: np.ndarray, labels: np.ndarray | None, *, train: bool, rng: np.random.Generator,
            step: int = 0) -> tuple[StepReport, np.ndarray | None]:
        """Run the schedule on one batch. Returns the report and, for inference, the logits (NCHW order)."""
        dev = self.device
        pool = dev.pool
        cs = dev.compute_stream
        sched, prog = self.schedule, self.program
        blocks: dict[str, Any] = {}
        offloaded: dict[str, _Offloaded] = {}
        encodings: dict[str, Any] = {}  # encoded buffer -> its Encoded (arrays in its enc: block)
        deferred_offsets: dict[str, int | None] = {}  # planned places of encodings allocated at their size
        sent: list[_Offloaded] = []
        self._sent = sent
        self._encodings = encodings
        loss_out: list[float] = []
        logits = None
        host_x = np.ascontiguousarray(np.asarray(x).transpose(0, 2, 3, 1) if x.ndim == 4 else x, dtype=self.dtype)
        input_buffer = sched.value[prog.input]
        uploaded = False
        if self._pinned_bytes:
            dev.reserve_pinned(self._pinned_bytes)  # before the step: no pinned allocation inside it
        pool.reset_peak()
        timeline = Timeline(origin=time.perf_counter())
        self._timeline = timeline
        try:
            for index, st in enumerate(sched.steps):
                kind = st[0]
                if kind == "alloc":
                    buf = sched.buffers[st[1]]
                    if buf.name in self._deferred:  # allocated by its encode step, at its actual size
                        deferred_offsets[buf.name] = sched.offsets.get(index)
                        continue
                    blocks[buf.name] = pool.allocate(buf.nbytes, cs, buf.category, high=buf.high,
                                                     offset=sched.offsets.get(index))
                    if buf.name == input_buffer and not uploaded:
                        dev.copy_to_device(self._value(blocks, prog.input), host_x, stream=cs)
                        uploaded = True
                    elif buf.name == "labels":
                        dev.copy_to_device(self._labels(blocks), np.asarray(labels, dtype=np.int64), stream=cs)
                elif kind == "free":
                    pool.free(blocks.pop(st[1]), cs)
                elif kind == "fwd":
                    self._forward(st[1], blocks, train, rng)
                elif kind == "bwd":
                    self._backward(st[1], blocks)
                elif kind == "loss":
                    self._loss(blocks, loss_out)
                elif kind == "acc":
                    g = self._grad(blocks, st[1])
                    tmp = self._view(blocks, st[2], g.shape, self.dtype)
                    self._launch(f"acc:{prog.tensors[st[1]].name}", np.add, g, tmp, g)
                elif kind == "update":
                    self._launch("update", self._update, step)
                elif kind == "offload":
                    self._offload(st[1], blocks, offloaded)
                elif kind == "encode":
                    self._encode(st[1], blocks, encodings, deferred_offsets.get(sched.encoded[st[1]]))
                elif kind == "decode":
                    self._decode(st[1], blocks, encodings)
                elif kind == "prefetch":
                    self._prefetch(st[1], blocks, offloaded)
                elif kind == "wait":
                    self._stall(f"wait:{st[1]}", offloaded.pop(st[1]).back)  # back on the device for good
                else:
                    raise ValueError(f"unknown schedule step {st!r}")
                if kind == "fwd" and st[1] == len(prog.ops) - 1 and not train:
                    logits = np.empty(prog.tensors[prog.output].shape, self.dtype)
                    dev.copy_to_host(logits, self._value(blocks, prog.output), stream=cs)
            dev.synchronize()
            moved = sum(off.moved for off in sent)
            pool.reclaim()  # every event has completed: coalesce, so each step starts as the plan's replay does
        except BaseException:
            for block in blocks.values():
                pool.free(block, cs)
            for off in offloaded.values():
                if off.back is None:  # still only on the host (a prefetched buffer's host copy is already returned)
                    dev.pinned.free(off.host_block, off.done)
            try:
                dev.synchronize()
            except BaseException:
                pass  # the original error is the one to report
            raise
        seconds = time.perf_counter() - timeline.origin
        report = StepReport(loss=loss_out[0] if loss_out else float("nan"), seconds=seconds,
                            peak_bytes=pool.peak, average_bytes=timeline.average_bytes(pool.in_use),
                            offloaded_bytes=moved, stall_seconds=timeline.stall_seconds, timeline=timeline)
        return report, logits

    # -- streams -----------------------------------------------------------------------------------
    def _launch(self, name: str, fn: Any, *args: Any, kind: str = "compute") -> None:
        """Enqueue ``fn`` on the compute stream as a timed span."""
        self.device.compute_stream.launch(_timed, self._timeline, name, "compute", kind, self.device.pool.usage(),
                                          fn, *args)

    def _stall(self, name: str, event: Any) -> None:
        """The compute stream waits for a memory-stream event; the wait is recorded as a stall."""
        self._launch(name, event.synchronize, kind="wait")

    def _host_nbytes(self, name: str) -> int:
        """Pinned bytes an offloaded buffer needs: its size, or its codec's worst case."""
        if name not in self._codecs:
            return self.schedule.buffers[name].nbytes
        codec, shape = self._codecs[name]
        logical = (shape[0], shape[3], shape[1], shape[2]) if len(shape) == 4 else shape
        return transfer.host_nbytes(codec, logical)

    def _offload(self, name: str, blocks: dict[str, Any], offloaded: dict[str, _Offloaded]) -> None:
        """Copy a buffer to pinned host memory on the memory stream once compute has produced and last
        read it (encoding it on the way if the plan names a codec: only the encoded bytes cross the bus),
        then release it as the plan's sync mode says."""
        dev = self.device
        cs, ms = dev.compute_stream, dev.memory_stream
        block = blocks.pop(name)
        host_block = dev.pinned.allocate(self._host_bytes[name], self.schedule.buffers[name].category)
        off = _Offloaded(host_block, dev.host_view(host_block, (host_block.nbytes,), np.uint8))
        ms.wait(cs.record())
        if name in self._codecs:
            codec, shape = self._codecs[name]
            ms.launch(_timed, self._timeline, f"offload:{name}", "memory", "offload", {}, self._send, codec,
                      dev.view(block, shape, self.dtype), off, name)
        else:
            off.moved = block.nbytes
            ms.launch(_timed, self._timeline, f"offload:{name}", "memory", "offload", {}, dev.copy_now,
                      off.host[:block.nbytes], dev.view(block, (block.nbytes,), np.uint8), "d2h")
        off.done = ms.record()
        offloaded[name] = off
        self._sent.append(off)
        if self.plan.sync == "event":
            dev.pool.free(block, ms)  # reusable by compute only once the copy's event has completed
        else:
            self._stall(f"sync:{name}", off.done)
            dev.pool.free(block, cs)

    def _send(self, codec: Any, src: np.ndarray, off: _Offloaded, name: str) -> None:
        off.enc = transfer.send(self.device, codec, src, off.host, self._range(name))
        off.moved = off.enc.nbytes

    def _range(self, name: str) -> tuple[Any, Any] | None:
        """Per-channel (lo, hi) of a fixed-point buffer that follows a batch norm: beta +- sigmas * |gamma|,
        clamped at 0 after a ReLU (read when the encoding runs: after the forward, before the update)."""
        if name not in self._bn_ranges:
            return None
        i, relu, sigmas = self._bn_ranges[name]
        xp, p = self.xp, self._op_params[i]
        half = xp.abs(p["weight"]) * p["weight"].dtype.type(sigmas)
        lo, hi = p["bias"] - half, p["bias"] + half
        return (xp.maximum(lo, 0), xp.maximum(hi, 0)) if relu else (lo, hi)

    def _prefetch(self, name: str, blocks: dict[str, Any], offloaded: dict[str, _Offloaded]) -> None:
        """Copy an offloaded buffer back into its newly allocated block on the memory stream."""
        dev = self.device
        cs, ms = dev.compute_stream, dev.memory_stream
        off = offloaded[name]
        block = blocks[name]
        ms.wait(cs.record())  # the block's previous users on compute are done
        if name in self._codecs:
            codec, shape = self._codecs[name]
            dst = dev.view(block, shape, self.dtype)  # off.enc is set by the offload's task: read it when this one runs
            ms.launch(_timed, self._timeline, f"prefetch:{name}", "memory", "prefetch", {},
                      lambda: transfer.receive(dev, codec, off.enc, dst))
        else:
            ms.launch(_timed, self._timeline, f"prefetch:{name}", "memory", "prefetch", {}, dev.copy_now,
                      dev.view(block, (block.nbytes,), np.uint8), off.host[:block.nbytes], "h2d")
        off.back = ms.record()
        dev.pinned.free(off.host_block, off.back)

    # -- encodings kept on the device (Gist) ----------------------------------------------------------
    def _encode(self, name: str, blocks: dict[str, Any], encodings: dict[str, Any], offset: int | None) -> None:
        """Encode a buffer into its ``enc:`` block after its last forward use. Encodings whose size depends
        on the data wait for the data (the host waits for the compute stream), then get a block of their
        actual size: at the planned place when it is no larger than planned."""
        codec, shape = self._codecs[name]
        enc_name = self.schedule.encoded[name]
        src = self.device.view(blocks[name], shape, self.dtype)
        if enc_name not in self._deferred:
            raw = self._view(blocks, enc_name, (blocks[enc_name].nbytes,), np.uint8)
            self._launch(f"encode:{name}", lambda: encodings.__setitem__(
                enc_name, codecs.encode_channels_last(codec, src, *(self._range(name) or ())).store(raw)))
            return
        pool, cs = self.device.pool, self.device.compute_stream
        cs.synchronize()
        start = time.perf_counter()
        enc = codecs.encode_channels_last(codec, src)
        nbytes = enc.nbytes + codecs.STORE_SLACK
        planned = self.schedule.buffers[enc_name].nbytes
        block = pool.allocate(nbytes, cs, "encoded", offset=offset if nbytes <= planned else None)
        blocks[enc_name] = block
        encodings[enc_name] = enc.store(self._view(blocks, enc_name, (block.nbytes,), np.uint8))
        usage = pool.usage()
        self._timeline.record(Span(f"encode:{name}", "compute", "compute", start, time.perf_counter(),
                                   sum(usage.values()), usage))

    def _decode(self, name: str, blocks: dict[str, Any], encodings: dict[str, Any]) -> None:
        """Decode a buffer back into its (newly allocated) block before the first backward that reads it."""
        codec, shape = self._codecs[name]
        enc_name = self.schedule.encoded[name]
        dst = self.device.view(blocks[name], shape, self.dtype)
        self._launch(f"decode:{name}", lambda: codecs.decode_channels_last(codec, encodings.pop(enc_name), dst))

    # -- views -------------------------------------------------------------------------------------
    def _view(self, blocks: dict[str, Any], name: str, shape: tuple, dtype: Any) -> np.ndarray:
        return self.device.view(blocks[name], shape, dtype)

    def _value(self, blocks: dict[str, Any], tensor: int) -> np.ndarray:
        t = self.program.tensors[tensor]
        return self._view(blocks, self.schedule.value[tensor], physical(t.shape), self.dtype)

    def _grad(self, blocks: dict[str, Any], tensor: int) -> np.ndarray:
        t = self.program.tensors[tensor]
        return self._view(blocks, self.schedule.grad[tensor], physical(t.shape), self.dtype)

    def _labels(self, blocks: dict[str, Any]) -> np.ndarray:
        return self._view(blocks, "labels", (self.program.batch,), np.int64)

    def _ctx(self, i: int, blocks: dict[str, Any], train: bool, rng: Any, algo: Any, pass_: str) -> Ctx:
        op = self.program.ops[i]
        sched = self.schedule
        aux = {k: self._view(blocks, sched.aux[(i, k)], a.shape, self._aux_dtype[(i, k)]) for k, a in op.aux.items()}
        ws_name = sched.workspace.get((i, pass_))
        ws = self._view(blocks, ws_name, (sched.buffers[ws_name].nbytes,), np.uint8) if ws_name else None
        return Ctx(xp=self.xp, params=self._op_params[i], grads=self._op_grads[i], aux=aux, train=train, rng=rng,
                   workspace=ws, algo=algo, in_shapes=tuple(physical(s) for s in op.in_shapes))

    # -- ops ---------------------------------------------------------------------------------------
    def _forward(self, i: int, blocks: dict[str, Any], train: bool, rng: Any) -> None:
        op = self.program.ops[i]
        algo = self.plan.algos.get(op.name, {}).get("forward")
        ctx = self._ctx(i, blocks, train, rng, algo, "fwd")
        xs = [self._value(blocks, t) for t in op.inputs]
        y = self._value(blocks, op.output)
        self._launch(op.name, op.layer.forward, ctx, xs, y)

    def _backward(self, i: int, blocks: dict[str, Any]) -> None:
        op = self.program.ops[i]
        sched = self.schedule
        algos = self.plan.algos.get(op.name, {})
        ctx = self._ctx(i, blocks, True, None, (algos.get("backward_data"), algos.get("backward_filter")), "bwd")
        dy = self._grad(blocks, op.output)
        out_buffer = sched.value[op.output]
        if op.reads_output and out_buffer in sched.binarized:  # ReLU's backward on the bits (Gist)
            if sched.needs_grad[op.inputs[0]]:
                enc_name, dx = sched.encoded[out_buffer], self._grad(blocks, op.inputs[0])
                self._launch(f"{op.name}.backward", lambda: codecs.Binarize.relu_backward(
                    self._encodings[enc_name], dy, dx))
            return
        xs = [self._value(blocks, t) for t in op.inputs] if op.reads_input else None
        y = self._value(blocks, op.output) if op.reads_output else None
        dxs = []
        for j, t in enumerate(op.inputs):
            if not sched.needs_grad[t]:
                dxs.append(None)
            elif (i, j) in sched.acc:
                dxs.append(self._view(blocks, sched.acc[(i, j)], physical(self.program.tensors[t].shape), self.dtype))
            else:
                dxs.append(self._grad(blocks, t))
        self._launch(f"{op.name}.backward", op.layer.backward, ctx, dy, xs, y, dxs)

    def _loss(self, blocks: dict[str, Any], out: list[float]) -> None:
        prog = self.program
        logits = self._value(blocks, prog.output)
        probs = self._view(blocks, "probs", logits.shape, self.dtype)
        value = self._view(blocks, "loss", (1,), self.dtype)
        labels = self._labels(blocks)
        dlogits = self._grad(blocks, prog.output)
        loss, xp = self.loss, self.xp

        def run() -> None:
            value[0] = loss.forward(xp, logits, labels, probs)
            loss.backward(xp, probs, labels, dlogits)
            out.append(float(value[0]))

        self._launch("loss", run)

    def _update(self, step: int) -> None:
        opt, xp = self.optimizer, self.xp
        assert opt is not None
        for param, grad, state in self._updates:
            opt.update(xp, param, grad, state, step)
