"""The optimizer's side of a step, as the executor carries it out: the parameters this process updates, their
update (one fused kernel per parameter where the device has it, reading the step's finite flag on the device;
else the optimizer's own NumPy/CuPy update, the host deciding), the loss scale undone first, and batch norm's
running statistics kept aside before the forward and put back where the step is skipped."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ..codecs import native
from ..codecs import step as step_kernels
from ..codecs.base import address
from ..optim import Optimizer
from ..schedule import Key, Kind, Schedule
from ..schedule.steps import Update
from .params import DeviceParams

if TYPE_CHECKING:
    from .._typing import Array
    from ..device.base import Device
    from .executor import _Run

__all__ = ["Updates"]


class Updates:
    """What a schedule's Update steps touch on ``device`` (see the module docstring): every trainable
    parameter with its gradient and optimizer state, or where the state is sharded over the ranks, those
    whose state this process keeps; grouped per Update step's bucket."""

    def __init__(self, device: Device, schedule: Schedule, params: DeviceParams, optimizer: Optimizer | None):
        self.device, self.optimizer, self.xp = device, optimizer, device.xp
        program = schedule.program
        slots = optimizer.slots if optimizer is not None else ()
        updated = [
            key
            for key in (f"{op.name}.{k}" for op, k, s in program.owned_params() if s.trainable)
            if all(Key(Kind.OPT_STATE, key, slot) in params.views for slot in slots)
        ]
        #: (weight, gradient, optimizer state by slot) of each parameter this process updates
        self.params: list[tuple[Any, Any, dict[str, Any]]] = (
            [
                (
                    params.views[Key(Kind.WEIGHT, key)],
                    params.views[Key(Kind.WEIGHT_GRAD, key)],
                    {slot: params.views[Key(Kind.OPT_STATE, key, slot)] for slot in slots},
                )
                for key in updated
            ]
            if optimizer is not None
            else []
        )
        sizes = [p.size for p, _, _ in self.params]
        #: where the optimizer's fused kernel runs (float32 parameters on a device the kernels are built for;
        #: None: the optimizer's own update, the finite flag read on the host)
        self.fused_on = (
            native.backend(self.params[0][0])
            if self.params and all(p.dtype == np.float32 for p, _, _ in self.params)
            else None
        )
        #: the momentum buffer the fused SGD kernel is given where the optimizer keeps none (never read or
        #: written): one array made here, so that no step uploads one
        self.no_slot = (
            self.xp.zeros(1, np.float32) if self.fused_on is not None and optimizer is not None and not slots else None
        )
        #: the fused update's scalars where its kernel reads them on a GPU: copied there from the step's
        #: pinned staging at its first update, so that a step replayed as a CUDA graph reads its own (the CPU
        #: build reads the staging itself)
        self.scalars = (
            self.xp.zeros(step_kernels.UPDATE_SCALARS, np.float32)
            if self.fused_on is not None and optimizer is not None and device.asynchronous
            else None
        )
        index = {key: i for i, key in enumerate(updated)}
        #: per Update step's bucket: the indices of its parameters and their sizes (every one for None)
        self.buckets: dict[tuple[str, ...] | None, tuple[list[int], list[int]]] = {}
        for st in schedule.steps:
            if type(st) is Update:
                ids = list(range(len(self.params))) if st.params is None else [index[k] for k in st.params]
                self.buckets[st.params] = (ids, [sizes[i] for i in ids])
        #: state a forward changes besides the weights (batch norm's running statistics): kept aside at the
        #: start of a step, put back if the step turns out not finite
        state = (
            [
                (s, params.views[Key(Kind.WEIGHT, f"{op.name}.{k}")])
                for op, k, s in program.owned_params()
                if not s.trainable
            ]
            if optimizer is not None
            else []
        )
        self.stats = [view for _, view in state]
        #: where they are kept aside, and the step's "not finite" flag: made here, so that no step allocates
        self.kept = [self.xp.empty_like(v) for v in self.stats]
        self.skip = self.xp.empty(1, np.bool_)
        #: of those, what a forward updates, which the finite check sums too; not a constant the model holds
        #: (``init="value"``: an imported attention mask's -inf is meant)
        self.updated = [view for s, view in state if s.init != "value"]
        #: every weight gradient (what the finite check reads)
        self.grads = [v for k, v in params.views.items() if k.kind is Kind.WEIGHT_GRAD]
        #: the finite check as one kernel over every gradient and updated statistic (their addresses and
        #: offsets put on the device once, here), where the kernels are built and they are contiguous float32
        self.multi = self._multi(self.grads + self.updated)

    def _multi(self, tensors: list) -> tuple[Any, Any, int, Any, Any] | None:
        """(addresses, offsets, values in all, backend, flag) of :meth:`finite`'s kernel over ``tensors``: the
        two tables and the flag put on the device once, with the executor (a few bytes, outside the plan), so
        that every step's check reads and writes the same addresses; None where the kernel does not apply."""
        if not tensors or any(t.dtype != np.float32 or not t.flags.c_contiguous for t in tensors):
            return None
        on = native.backend(tensors[0])
        if on is None:
            return None
        offsets = np.zeros(len(tensors) + 1, np.int64)
        np.cumsum([t.size for t in tensors], out=offsets[1:])
        ptrs = np.asarray([address(t) for t in tensors], np.uint64)
        xp = self.xp
        return xp.asarray(ptrs), xp.asarray(offsets), int(offsets[-1]), on, xp.empty(1, np.uint8)

    def keep(self, r: "_Run") -> Callable[[], None]:
        """The work that copies batch norm's running statistics aside into ``r.kept_stats`` (on the compute
        stream, before the forward)."""
        xp, stats = self.xp, self.stats

        kept = self.kept

        def keep() -> None:
            for k, v in zip(kept, stats):
                xp.copyto(k, v)
            r.kept_stats = kept

        return keep

    def work(self, r: "_Run", st: Update) -> Callable[[], None]:
        """The work of Update step ``st`` of run ``r``: the step's finite flag made by its first bucket (on the
        device; a skipped step puts batch norm's statistics back), the loss scale undone, each parameter of the
        bucket updated."""
        opt, xp, step = self.optimizer, self.xp, r.step
        bucket, sizes = self.buckets[st.params]
        fused = self.fused(step)

        def update(j: int) -> None:  # each parameter is updated on its own: on the CPU, any lane may take it
            param, grad, state = self.params[bucket[j]]
            if fused is not None:  # one pass, and only where the device flag says the step is finite
                kernel, _, on = fused
                slots = [state[s] for s in opt.slots] or [self.no_slot]  # type: ignore[union-attr]
                step_kernels.optimizer_update(kernel, param, grad, slots, r.ok, scalars, on)
            else:
                opt.update(xp, param, grad, state, step)  # type: ignore[union-attr]

        scalars = self.scalars if self.scalars is not None else r.batch.get("scalars")
        inverse = None if r.scale is None else np.float32(1.0 / r.scale)  # as PyTorch's: 1/scale in float32

        def unscale(j: int) -> None:  # the gradient back to the loss's own scale (scratch where not finite)
            grad = self.params[bucket[j]][1]
            grad *= inverse

        def run() -> None:
            if r.ok is None:  # the step's first bucket decides for every one, on the device
                if self.scalars is not None:  # this step's scalars, from its staging (stream-ordered)
                    self.device.copy_now(self.scalars, r.batch["scalars"], "h2d")
                r.ok = self.finite(r)
                skip = xp.logical_not(r.ok.reshape(1), out=self.skip)
                for view, kept in zip(self.stats, r.kept_stats):  # a skipped step changes nothing
                    xp.copyto(view, kept, where=skip)
            if fused is None and not r.ok.item():  # an update without a fused kernel: the host decides
                return
            ops = self.device.ops
            assert ops is not None  # a device that runs steps runs their array work
            if r.scale is not None:
                ops.each(sizes, unscale)
            ops.each(sizes, update)

        return run

    def stage(self, step: int, out: np.ndarray) -> None:
        """Write step ``step``'s fused-update scalars into ``out`` (the step's pinned staging)."""
        fused = self.fused(step)
        if fused is not None:
            step_kernels.update_scalars(fused[1], out)

    def fused(self, step: int) -> tuple[str, tuple, Any] | None:
        """(kernel, scalars, backend) of the optimizer's fused update at ``step``, or None (no kernel for
        this optimizer, none built for this device, or parameters not in float32)."""
        if self.fused_on is None or self.optimizer is None:
            return None
        made = self.optimizer.fused(step)
        return None if made is None else (made[0], made[1], self.fused_on)

    def finite(self, r: "_Run") -> Array:
        """The step's finite flag on the device (a bool array of one value): whether the loss, every weight
        gradient and every updated statistic are finite, computed without the host reading anything: by one
        kernel over them all (:attr:`multi`), else by sums (a sum is NaN or infinite if any term is; it may
        also overflow where the gradients are near float32's largest value: then the step is skipped too)."""
        xp = self.xp
        if self.multi is not None:  # three launches whatever the number of tensors
            ptrs, offsets, total, on, ok = self.multi
            if r.loss_ok is None:
                ok.fill(1)
            else:
                xp.copyto(ok, xp.reshape(r.loss_ok, (1,)), casting="unsafe")
            step_kernels.finite_multi(ptrs, offsets, total, ok, on)
            return ok.view(np.bool_)
        ok = xp.ones(1, bool) if r.loss_ok is None else xp.reshape(r.loss_ok, (1,))
        if self.grads:  # every gradient (a rank that updates a share, even none, decides as all do)
            total = sum(g.sum() for g in self.grads)
            ok = xp.logical_and(ok, xp.isfinite(total))
        if self.updated:  # what the forward changed besides (batch norm's running statistics): a batch whose
            # variance overflows leaves a finite loss and an infinite running_var, which every later step reads
            ok = xp.logical_and(ok, xp.isfinite(sum(v.sum(dtype=np.float64) for v in self.updated)))
        return ok
