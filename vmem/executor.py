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

from .graph import Program
from .nn.base import Ctx, physical
from .optim import Optimizer
from .policies.plan import Plan
from .schedule import Buffer, Schedule

__all__ = ["Executor", "DeviceParams", "StepReport", "OpSpan"]


@dataclass
class OpSpan:
    """One op on a stream: what, when (seconds, perf_counter clock) and the pool usage meanwhile."""

    name: str
    stream: str
    start: float
    end: float
    in_use: int


@dataclass
class StepReport:
    """What one training step did and used. Bytes are the device pool's (with fragmentation)."""

    loss: float
    seconds: float
    peak_bytes: int
    average_bytes: float
    offloaded_bytes: int = 0
    stall_seconds: float = 0.0
    spans: list[OpSpan] = field(default_factory=list, repr=False)

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


def _timed(spans: list[OpSpan], name: str, stream: str, in_use: int, fn: Any, *args: Any) -> None:
    start = time.perf_counter()
    fn(*args)
    spans.append(OpSpan(name, stream, start, time.perf_counter(), in_use))


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
        spans: list[OpSpan] = []
        loss_out: list[float] = []
        logits = None
        host_x = np.ascontiguousarray(np.asarray(x).transpose(0, 2, 3, 1) if x.ndim == 4 else x, dtype=self.dtype)
        pool.reset_peak()
        t0 = time.perf_counter()
        try:
            for st in sched.steps:
                kind = st[0]
                if kind == "alloc":
                    buf = sched.buffers[st[1]]
                    blocks[buf.name] = pool.allocate(buf.nbytes, cs, buf.category)
                    if buf.name == sched.value[prog.input]:
                        dev.copy_to_device(self._value(blocks, prog.input), host_x, stream=cs)
                    elif buf.name == "labels":
                        dev.copy_to_device(self._labels(blocks), np.asarray(labels, dtype=np.int64), stream=cs)
                elif kind == "free":
                    pool.free(blocks.pop(st[1]), cs)
                elif kind == "fwd":
                    self._forward(st[1], blocks, spans, train, rng)
                elif kind == "bwd":
                    self._backward(st[1], blocks, spans)
                elif kind == "loss":
                    self._loss(blocks, spans, loss_out)
                elif kind == "acc":
                    g = self._grad(blocks, st[1])
                    tmp = self._view(blocks, st[2], g.shape, self.dtype)
                    cs.launch(_timed, spans, f"acc:{prog.tensors[st[1]].name}", "compute", pool.in_use,
                              np.add, g, tmp, g)
                elif kind == "update":
                    cs.launch(_timed, spans, "update", "compute", pool.in_use, self._update, step)
                else:
                    raise ValueError(f"unknown schedule step {st!r}")
                if kind == "fwd" and st[1] == len(prog.ops) - 1 and not train:
                    logits = np.empty(prog.tensors[prog.output].shape, self.dtype)
                    dev.copy_to_host(logits, self._value(blocks, prog.output), stream=cs)
            cs.synchronize()
        except BaseException:
            for block in blocks.values():
                pool.free(block, cs)
            try:
                cs.synchronize()
            except BaseException:
                pass  # the original error is the one to report
            raise
        seconds = time.perf_counter() - t0
        busy = sum(s.end - s.start for s in spans)
        average = sum(s.in_use * (s.end - s.start) for s in spans) / busy if busy > 0 else float(pool.in_use)
        report = StepReport(loss=loss_out[0] if loss_out else float("nan"), seconds=seconds,
                            peak_bytes=pool.peak, average_bytes=average, spans=spans)
        return report, logits

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

    def _ctx(self, i: int, blocks: dict[str, Any], train: bool, rng: Any, algo: Any) -> Ctx:
        op = self.program.ops[i]
        sched = self.schedule
        aux = {k: self._view(blocks, sched.aux[(i, k)], a.shape, self._aux_dtype[(i, k)]) for k, a in op.aux.items()}
        ws_name = sched.workspace.get(i)
        ws = self._view(blocks, ws_name, (sched.buffers[ws_name].nbytes,), np.uint8) if ws_name else None
        return Ctx(xp=self.xp, params=self._op_params[i], grads=self._op_grads[i], aux=aux, train=train, rng=rng,
                   workspace=ws, algo=algo, in_shapes=tuple(physical(s) for s in op.in_shapes))

    # -- ops ---------------------------------------------------------------------------------------
    def _forward(self, i: int, blocks: dict[str, Any], spans: list[OpSpan], train: bool, rng: Any) -> None:
        op = self.program.ops[i]
        algo = self.plan.algos.get(op.name, {}).get("forward")
        ctx = self._ctx(i, blocks, train, rng, algo)
        xs = [self._value(blocks, t) for t in op.inputs]
        y = self._value(blocks, op.output)
        self.device.compute_stream.launch(_timed, spans, op.name, "compute", self.device.pool.in_use,
                                          op.layer.forward, ctx, xs, y)

    def _backward(self, i: int, blocks: dict[str, Any], spans: list[OpSpan]) -> None:
        op = self.program.ops[i]
        sched = self.schedule
        algos = self.plan.algos.get(op.name, {})
        ctx = self._ctx(i, blocks, True, None, (algos.get("backward_data"), algos.get("backward_filter")))
        dy = self._grad(blocks, op.output)
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
        self.device.compute_stream.launch(_timed, spans, f"{op.name}.backward", "compute", self.device.pool.in_use,
                                          op.layer.backward, ctx, dy, xs, y, dxs)

    def _loss(self, blocks: dict[str, Any], spans: list[OpSpan], out: list[float]) -> None:
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

        self.device.compute_stream.launch(_timed, spans, "loss", "compute", self.device.pool.in_use, run)

    def _update(self, step: int) -> None:
        opt, xp = self.optimizer, self.xp
        assert opt is not None
        for param, grad, state in self._updates:
            opt.update(xp, param, grad, state, step)
