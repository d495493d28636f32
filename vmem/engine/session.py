"""The engine under a Trainer: one network's training state on one device.

A :class:`Session` plans each batch size with its policy (through the planner: training steps and evaluation
passes alike), lowers and keeps an executor per batch, holds the weights, their gradients and the optimizer
state in the device pool, profiles the device where the policy decides by time, and builds the refusals
that say what would fit. The :class:`~vmem.training.Trainer` is the loop around it: epochs, metrics,
callbacks, checkpoints.
"""

from __future__ import annotations

from typing import Any, Callable, TYPE_CHECKING

import numpy as np

from ..errors import BudgetTooSmall, OutOfDeviceMemory, PlanError
from ..graph import Network
from ..planning import PlannedStep, PlanResult, Target, advice, floor_policy, plan_program, plan_step, rank_plan
from ..planning.inference import inference_plan, persistent
from ..policies.budget import largest_fitting
from ..runtime import DeviceParams, Executor
from ..runtime.micro import MicroBatched, Sums
from ..units import format_bytes

if TYPE_CHECKING:
    from ..device.base import Device
    from ..optim import Optimizer
    from ..policies.base import Policy
    from ..distributed.group import ProcessGroup
    from ..graph.program import Program

__all__ = ["Session"]


class Session:
    """One network's training state on one device under a policy: its plans, executors, parameters on the
    device and profiles (see the module docstring). Made by a Trainer; closed with :meth:`release`."""

    def __init__(
        self,
        net: Network,
        device: Device,
        policy: Policy,
        loss: Any,
        optimizer: Optimizer,
        *,
        input_shape: tuple[int, ...],
        dtype: str,
        precision: str = "fp32",
        profiling: bool,
        profile_cache: bool,
        seed: int,
        group: ProcessGroup | None = None,
        sync_batch_norm: bool = False,
        shard_optimizer: bool = False,
    ):
        self.net, self.device, self.policy, self.loss, self.optimizer = net, device, policy, loss, optimizer
        #: what every plan of this session is made for (the device's spec, alignment and catalog), read once
        self.target = Target.of(device)
        self.input_shape, self.dtype, self.profiling, self.profile_cache, self.seed = (
            input_shape,
            dtype,
            profiling,
            profile_cache,
            seed,
        )
        self.precision = precision
        #: the ranks of a data-parallel run (None: one process), and the stream their all-reduces run on
        self.group = group
        self._comm: Any = None
        #: batch norm's statistics summed over the ranks, on a channel of their own (synchronized batch norm)
        self._batch_group = group.dup() if group is not None and sync_batch_norm else None
        #: the optimizer's state sharded over the ranks (ZeRO's stage 1): each keeps its parameters' share
        self.shard_optimizer = bool(shard_optimizer) and group is not None
        self.costs: dict[int, Any] = {}
        #: whether each batch's profile came from the cache on disk (else measured in this process)
        self.kept: dict[int, bool] = {}
        #: measures the host's part of a step for a profile (the trainer's probe: vmem.engine.probe)
        self.host_overheads: Callable[[], tuple[float, float, float]] = lambda: (0.0, 0.0, 0.0)
        self.plans: dict[int, PlanResult] = {}
        self._params: DeviceParams | None = None
        self._executors: dict[tuple[int, bool], Executor | MicroBatched] = {}
        self._inference: dict[int, tuple[Any, int]] = {}  # evaluation batch -> (schedule or None, peak)

    # -- parameters ------------------------------------------------------------------------------
    def device_params(self) -> DeviceParams:
        if self._params is None:
            program = self.net.build(1, self.input_shape, self.dtype, self.precision)
            specs = self.net.param_specs(self.input_shape)
            self._params = DeviceParams(self.device, self.persistent(program), specs, program.precision)
            self._params.upload(self.net.params)  # type: ignore[arg-type]
        return self._params

    def persistent(self, program: Program) -> list[Any]:
        """The buffers a run holds throughout: weights, gradients and optimizer state (this rank's share of
        it where it is sharded)."""
        shard = (self.group.size, self.group.rank) if self.shard_optimizer and self.group is not None else None
        return persistent(program, self.optimizer.slots, shard)

    def plan(self, batch: int) -> PlanResult:
        """The plan of a training step at ``batch`` (figures included), as ``vmem.plan`` gives it."""
        self.executor(batch, True, check=False)
        return self.plans[batch]

    def executor(self, batch: int, train: bool, check: bool = True) -> Executor | MicroBatched:
        key = (batch, train)
        ex = self._executors.get(key)
        if ex is not None:
            return ex

        def build(n: int) -> Program:
            return self.net.build(n, self.input_shape, self.dtype, self.precision)

        program = build(batch)
        if train:
            costs = self.profile(batch) if self.profiling else None
            try:  # whole, or as micro-batches where only those fit and this process trains alone
                planned = plan_step(
                    build,
                    batch,
                    self.target,
                    self.policy,
                    optimizer_slots=self.optimizer.slots,
                    costs=costs,
                    micro=self.group is None,
                )
            except BudgetTooSmall as exc:  # does not fit under any of the policy's choices: say which batch would
                raise BudgetTooSmall(f"{str(exc).rstrip('.')}; {self.batch_advice(batch)}", exc.least) from None
            if planned.micro is not None:
                return self._microbatched(batch, planned)
            plan, schedule = planned.result, planned.schedule
            assert schedule is not None  # a whole plan has its schedule
            if self.group is not None:  # gradients summed over the ranks, bucket by bucket, during backward
                plan, schedule = rank_plan(
                    plan,
                    schedule,
                    self.target.spec,
                    self.target.alignment,
                    costs,
                    self.group.size,
                    self.group.rank if self.shard_optimizer else None,
                )
            self.plans[batch] = plan
            if check and not plan.fits:
                raise self.refusal(program, plan)
        else:
            schedule, peak = self.inference_plan(batch)
            if schedule is None:
                raise self.eval_refusal(
                    peak,
                    f"evaluation at batch {batch} needs {format_bytes(peak)} beside the "
                    "training state; use a smaller evaluation batch (batch_size=)",
                )
        if train and self.group is not None and self._comm is None:
            self._comm = self.device.new_stream("comm")
        ex = Executor(
            self.device,
            schedule,
            self.device_params(),
            self.loss,
            self.optimizer if train else None,
            group=self.group if train else None,
            comm_stream=self._comm if train else None,
            batch_group=self._batch_group if train else None,
        )
        self._executors[key] = ex
        return ex

    def _microbatched(self, batch: int, planned: PlannedStep) -> MicroBatched:
        """The training step at ``batch`` run as the micro-batches ``planned`` (:mod:`vmem.planning.microbatch`)."""
        micro = planned.micro
        assert micro is not None
        sums = Sums() if micro.passes else None  # batch norm's whole-batch sums, found before each step
        made = {
            (p.accumulate, p.update): Executor(
                self.device, p.schedule, self.device_params(), self.loss, self.optimizer, batch_group=sums
            )
            for p in micro.parts
        }
        parts = [micro.part_of(i) for i in range(len(micro.sizes))]
        runner = MicroBatched(micro.sizes, [made[(p.accumulate, p.update)] for p in parts], sums)
        self.plans[batch] = planned.result
        self._executors[(batch, True)] = runner
        return runner

    def inference_plan(self, batch: int) -> tuple[Any, int]:
        """An evaluation pass at ``batch`` beside the training state (:func:`vmem.planning.inference.inference_plan`):
        (its schedule, its peak), or (None, the least peak it needs) where it does not fit; made once a batch."""
        if batch not in self._inference:
            program = self.net.build(batch, self.input_shape, self.dtype, self.precision)
            trained = next(iter(self.plans.values()), None)
            self._inference[batch] = inference_plan(
                program, self.target, self.persistent(program), trained.plan if trained is not None else None
            )
        return self._inference[batch]

    def eval_refusal(self, peak: int, remedy: str) -> OutOfDeviceMemory:
        """Evaluation does not fit beside the training state (said before anything runs)."""
        return advice.out_of_memory(self.device.pool, peak, {}, remedy)

    def eval_batch(self, n: int | None = None, limit: int = 256) -> int:
        """The largest evaluation batch, up to ``limit`` (and ``n``, the number of samples), whose pass fits
        the device beside the training state; what :meth:`evaluate` and :meth:`predict` use by default.
        Raises OutOfDeviceMemory where not even batch 1 fits."""
        batch = max(1, min(limit, n if n else limit))
        while True:
            schedule, peak = self.inference_plan(batch)
            if schedule is not None:
                return batch
            if batch == 1:
                raise self.eval_refusal(
                    peak,
                    "evaluation needs more memory than the training state leaves, even "
                    "one sample at a time; give the device more memory",
                )
            batch = max(1, batch // 2)

    def eval_batches(self, n: int, batch_size: int | None) -> int:
        """The evaluation batch for ``n`` samples (``batch_size`` checked, or the largest that fits), with the
        last partial batch planned too: nothing runs out of memory midway."""
        if batch_size is None:
            batch_size = self.eval_batch(n)
        elif isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} must be a positive int")
        for b in {min(int(batch_size), n), n % int(batch_size)} - {0}:
            schedule, peak = self.inference_plan(b)
            if schedule is None:
                raise self.eval_refusal(
                    peak,
                    f"evaluation at batch {b} does not fit beside the training state; "
                    f"leave batch_size out (the largest that fits: {self.eval_batch(n)})",
                )
        return int(batch_size)

    def profile(self, batch: int) -> Any:
        """Measured costs of a training step at ``batch`` on this device (see :mod:`vmem.costs.measured`); made
        once per batch size. vdnn-dyn uses them to choose; with them plans also predict step time."""
        if batch not in self.costs:
            from ..costs import cache

            program = self.net.build(batch, self.input_shape, self.dtype, self.precision)
            # on the device, within what its pool has free (never more than the budget); kept on disk, so
            # that the same run repeats (see vmem.costs.cache)
            # the host's part of a step measured with it and kept with it (a kept profile's is used)
            costs, kept = cache.profile(
                self.device.catalog(program),
                copy_gbps=self.device.spec.pcie_gbps,
                seed=self.seed,
                device=self.device,
                cache=self.profile_cache,
                host_overheads=self.host_overheads,
            )
            self.kept[batch] = kept
            self.costs[batch] = costs
        return self.costs[batch]

    def fits(self, batch: int) -> bool:
        """Whether this trainer's policy can train at ``batch`` on this device (the least plan it can
        choose, without a profile)."""
        program = self.net.build(batch, self.input_shape, self.dtype, self.precision)
        try:
            result, _ = plan_program(
                program, self.target, floor_policy(self.policy), optimizer_slots=self.optimizer.slots
            )
        except PlanError:
            return False
        return result.fits

    def largest_batch(self, batch: int) -> int | None:
        """The largest batch below ``batch`` that this trainer's policy trains in the device's memory (by
        bisection; None where not even batch 1 does)."""
        return largest_fitting(self.fits, batch - 1, unfit=batch) or None

    def batch_advice(self, batch: int) -> str:
        """What to do where ``batch`` does not fit: the largest batch that does (:func:`vmem.planning.advice.batch_advice`)."""
        return advice.batch_advice(self.largest_batch(batch), self.device.pool.capacity)

    def refusal(self, program: Program, plan: PlanResult) -> OutOfDeviceMemory:
        """The error for a plan that does not fit (:func:`vmem.planning.advice.refusal`)."""
        return advice.refusal(
            program,
            plan,
            self.target,
            self.policy,
            self.optimizer.slots,
            self.device.pool,
            self.batch_advice(plan.batch),
        )

    # -- lifetime ----------------------------------------------------------------------------------
    def download(self) -> dict[str, Any] | None:
        """The device's weights as host arrays (after the device's work), or None before any step."""
        if self._params is None:
            return None
        self.device.synchronize()
        return self._params.download()

    def release(self) -> None:
        """Give the parameters' device memory back and forget the executors."""
        if self._params is not None:
            self._params.release()
            self._params = None
        self._executors.clear()
        if self._comm is not None:
            comm, self._comm = self._comm, None
            comm.close()
