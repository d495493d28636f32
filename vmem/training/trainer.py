"""vmem.Trainer: the training loop. One step is the executor's; the loop adds epochs and metrics, and its
observers (:mod:`.callbacks`) show progress and save checkpoints (:mod:`.checkpoint`).

A Trainer plans each batch size it sees with its policy (refusing a plan that does not fit the device,
with a remedy), keeps the weights, their gradients and the optimizer state in the device pool for the
whole run, and copies weights back to the network on :meth:`sync` (done by ``fit``, ``save`` and
``close``).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence, TYPE_CHECKING

import numpy as np

from .. import policies
from ..data import Dataset
from ..device import device as make_device
from ..distributed import data_parallel, share
from ..errors import DeviceError, ShapeError
from ..graph import Network
from ..nn.loss import SoftmaxCrossEntropy
from ..optim import SGD, GradScaler, Optimizer
from ..planning import PlanResult
from ..precision import activations_dtype
from ..runtime import StepReport
from ..engine import Session, probe
from . import batches, state
from .callbacks import Callback, LossWatch, PrintEpochs, ProgressBar
from .diagnose import nonfinite_error, spill_warning
from .inputs import batch_arrays, check_labels, count, host_labels, loss_and_accuracy, on_device

if TYPE_CHECKING:
    from .._typing import Array
    from ..device.base import Device
    from ..policies.base import Policy
    from ..distributed.group import ProcessGroup

__all__ = ["Trainer", "History", "EpochStats"]


@dataclass
class EpochStats:
    epoch: int
    train_loss: float
    step_seconds: float  # median over the epoch
    peak_bytes: int
    average_bytes: float
    offloaded_bytes: int
    stall_seconds: float
    seconds: float
    val_loss: float | None = None
    val_accuracy: float | None = None

    @classmethod
    def of(cls, epoch: int, reports: list[StepReport]) -> "EpochStats":
        """The training figures of an epoch's step reports (NaN and 0 for an epoch resumed after its last
        step, which runs none)."""
        nan = float("nan")

        def mean(values: list[float]) -> float:
            return float(np.mean(values)) if values else nan

        return cls(
            epoch=epoch,
            train_loss=mean([r.loss for r in reports if not r.skipped]),
            step_seconds=float(np.median([r.seconds for r in reports])) if reports else nan,
            peak_bytes=max((r.peak_bytes for r in reports), default=0),
            average_bytes=mean([r.average_bytes for r in reports]),
            offloaded_bytes=max((r.offloaded_bytes for r in reports), default=0),
            stall_seconds=mean([r.stall_seconds for r in reports]),
            seconds=float(sum(r.seconds for r in reports)),
        )


@dataclass
class History:
    epochs: list[EpochStats] = field(default_factory=list)

    @property
    def last(self) -> EpochStats:
        return self.epochs[-1]

    def to_dict(self) -> list[dict[str, Any]]:
        return [asdict(e) for e in self.epochs]


def _training_device(device: Device | str, memory: int | str | None) -> Device:
    """The device a Trainer trains on: ``device`` opened with ``memory`` where it is a name, else as given
    (``memory=`` then refused); a closed device and a simulated GPU are refused."""
    if isinstance(device, str):
        dev = make_device(device, **({"memory": memory} if memory is not None else {}))
    elif memory is not None:
        raise ValueError("memory= applies only when the device is given by name")
    else:
        dev = make_device(device)
    if dev.closed:
        raise DeviceError(f"{dev.name} is closed (its memory is released): give a device that is open")
    if not dev.holds_data:
        raise DeviceError(f"{dev.name} is a simulated GPU: it plans (vmem.plan) but cannot train")
    return dev


def _fit_arguments(epochs: Any, initial_epoch: Any, batch_size: Any) -> int:
    """``fit``'s counts checked (a clear error naming the one that is wrong); the batch size as an int."""
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"fit: epochs={epochs!r} must be a positive int")
    if isinstance(initial_epoch, bool) or not isinstance(initial_epoch, int) or not 0 <= initial_epoch < epochs:
        raise ValueError(f"fit: initial_epoch={initial_epoch!r} must be an int from 0 to epochs - 1 ({epochs - 1})")
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"fit: batch_size={batch_size!r} must be a positive int")
    return int(batch_size)


def _of_session(name: str, doc: str) -> Any:
    """A read-only attribute of the Trainer that is its session's ``name``."""
    return property(lambda self: getattr(self.session, name), doc=doc)


def _optimizer(optimizer: Any) -> Optimizer:
    """The Trainer's optimizer: the one given (an object: a name is refused, saying how to give one), or SGD
    with momentum 0.9 at 0.01."""
    if optimizer is None:
        return SGD(lr=0.01, momentum=0.9)
    if not isinstance(optimizer, Optimizer):
        raise TypeError(
            f"optimizer={optimizer!r}: give an optimizer object, e.g. vmem.optim.SGD(lr=0.01, momentum=0.9) "
            "or vmem.optim.Adam(lr=1e-3)"
        )
    return optimizer


class Trainer:
    """Train ``net`` on ``device`` under a memory ``policy``.

    ``device``: a Device or a name (``"cpu"``; ``memory=`` then sets its capacity and the trainer closes
    it). ``policy``: a spec string or Policy; by default ``auto`` (every technique mixed for the budget)
    where a budget is given (``memory=``), else ``baseline``. ``loss`` defaults to SoftmaxCrossEntropy,
    ``optimizer`` to SGD(lr=0.01, momentum=0.9). ``seed`` seeds the weights (if the network has none yet),
    the shuffling and dropout, so the same seed gives bitwise-identical weights.

    ``group`` (a :class:`vmem.distributed.ProcessGroup` of more than one rank): data-parallel training. Every
    rank starts from rank 0's weights and trains on its own batches (:meth:`fit` gives each rank its
    contiguous share of every batch); the gradients are summed over the ranks during backward, in buckets,
    in rank order, and averaged; rank 0 writes checkpoints. ``sync_batch_norm``: batch norm's statistics are
    the whole batch's over every rank (else each rank's own). ``shard_optimizer``: each rank keeps the
    optimizer's state of its share of the parameters only (about 1/N of it; ZeRO's stage 1), updates those,
    and sends them to the others; checkpoints still hold all of it.

    Profiles (a policy that decides by measured time, ``auto`` or ``vdnn-dyn``) are kept on disk and reused
    by a run with the same program, device and machine (``profile_cache=False``, or
    ``VMEM_PROFILE_CACHE=0``, measures afresh): see :mod:`vmem.costs.cache`.

    A step whose loss or gradients are not finite changes nothing (weights, optimizer state, batch norm's
    statistics), is reported (``StepReport.skipped``) and warned about; after ``nonfinite_limit`` such
    steps in a row, training stops with :class:`~vmem.errors.NonFiniteError` naming the first op whose
    output was not finite.
    """

    def __init__(
        self,
        net: Network,
        device: Device | str = "cpu",
        policy: Policy | str | None = None,
        loss: Any = None,
        optimizer: Optimizer | None = None,
        seed: int = 0,
        *,
        input_shape: Sequence[int] | None = None,
        dtype: str = "float32",
        precision: str = "fp32",
        scaler: GradScaler | None = None,
        memory: int | str | None = None,
        profile: bool | None = None,
        nonfinite_limit: int = 5,
        profile_cache: bool = True,
        group: ProcessGroup | None = None,
        sync_batch_norm: bool = False,
        shard_optimizer: bool = False,
    ):
        if not isinstance(nonfinite_limit, int) or nonfinite_limit < 1:
            raise ValueError(f"nonfinite_limit={nonfinite_limit!r} must be a positive int")
        self.nonfinite_limit = nonfinite_limit
        #: epochs finished, batches done in the current one and the generator's state at its start (what a
        #: checkpoint needs to resume midway through an epoch); non-finite steps in a row
        self.epochs_done, self.epoch_step, self.skipped_in_a_row = 0, 0, 0
        self.epoch_rng: dict | None = None
        self.net = net
        shape = tuple(input_shape) if input_shape is not None else net.input_shape
        if shape is None:
            raise ShapeError(f"{net.name}: no input shape; pass input_shape=(C, H, W)")
        self.input_shape: tuple[int, ...] = shape
        self.dtype = dtype
        activations_dtype(precision)  # a clear error for a precision there is not (or bf16 without ml_dtypes)
        self.precision = precision
        #: fp16's dynamic loss scale (a GradScaler with PyTorch's defaults unless given); None otherwise
        self.scaler = scaler if scaler is not None else (GradScaler() if precision == "fp16" else None)
        if self.scaler is not None and precision != "fp16":
            raise ValueError("scaler= applies to precision='fp16' only (bf16 and fp32 need no loss scaling)")
        pol = policies.get(policy if policy is not None else ("auto" if memory is not None else "baseline"))
        self.loss = loss if loss is not None else (getattr(net, "loss", None) or SoftmaxCrossEntropy())
        self.optimizer = _optimizer(optimizer)
        self.seed, self.rng, self.steps_done = seed, np.random.default_rng(seed), 0
        if net.params is None:
            net.init(seed, dtype, self.input_shape)
        self._own_device = isinstance(device, str)
        self.device = _training_device(device, memory)
        #: the ranks training together (a :class:`vmem.distributed.ProcessGroup`); None: this process alone
        self.group = data_parallel.training_group(group, self.device, net.params or {})
        self.session = Session(
            net,
            self.device,
            pol,
            self.loss,
            self.optimizer,
            input_shape=self.input_shape,
            dtype=dtype,
            precision=precision,
            # a policy that decides by time needs measured costs; any other may ask for them (plan times)
            profiling=pol.needs_profile if profile is None else bool(profile),
            profile_cache=bool(profile_cache),
            seed=seed,
            group=self.group,
            sync_batch_norm=bool(sync_batch_norm),
            shard_optimizer=bool(shard_optimizer),
        )
        device_ = self.device
        self.session.host_overheads = lambda: probe.overheads(device_)
        self._closed = False
        self._spill_told: set[int] = set()  # batch sizes whose plan has been told to spill
        #: the run's settings, kept in its checkpoints (``batch``: the last ``fit``'s), so that a resumed run
        #: can say where it differs (``vmem.training.checkpoint.settings`` reads them back)
        self.settings: dict[str, Any] = {
            "seed": seed,
            "precision": precision,
            "policy": pol.spec,
            "lr": getattr(self.optimizer, "lr", None),
            "math": self.device.spec.math,
        }

    # -- the engine (vmem.engine.Session), read through ---------------------------------------------
    plans = _of_session("plans", "The plan of each training batch size this trainer has run (or planned), by batch.")
    policy = _of_session("policy", "The memory policy (a Policy) this trainer plans with.")
    profiling = _of_session("profiling", "Whether plans are made with a profile of this device (measured costs).")
    profile_cache = _of_session("profile_cache", "Whether profiles are kept on disk and reused (vmem.costs.cache).")
    costs = _of_session("costs", "The profiles made so far, by batch.")

    def plan(self, batch: int) -> PlanResult:
        """The plan of a training step at ``batch`` (figures included), as ``vmem.plan`` gives it."""
        self._check_open()
        return self.session.plan(batch)

    def eval_batch(self, n: int | None = None, limit: int = 256) -> int:
        """The largest evaluation batch, up to ``limit`` (and ``n``, the number of samples), whose pass fits
        the device beside the training state; what :meth:`evaluate` and :meth:`predict` use by default.
        Raises OutOfDeviceMemory where not even batch 1 fits."""
        self._check_open()
        return self.session.eval_batch(n, limit)

    def profile(self, batch: int) -> Any:
        """Measured costs of a training step at ``batch`` on this device (see :mod:`vmem.costs.measured`); made
        once per batch size. vdnn-dyn uses them to choose; with them plans also predict step time."""
        return self.session.profile(batch)

    def largest_batch(self, batch: int) -> int | None:
        """The largest batch below ``batch`` that this trainer's policy trains in the device's memory (by
        bisection; None where not even batch 1 does)."""
        return self.session.largest_batch(batch)

    def num_parameters(self) -> int:
        """How many trainable values the network has (a count of values, not bytes; batch norm's running
        statistics are state, not parameters)."""
        return self.net.num_params(self.input_shape)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(
                f"{self.net.name}: this Trainer is closed (its device memory is released); make a new one"
            )

    def _check_input(self, x: Array, y: np.ndarray | None) -> Any:
        """``x`` as the executor takes it (:func:`~vmem.training.inputs.batch_arrays`), checked with its
        labels ``y``."""
        self._check_open()
        x = batch_arrays(self.net, self.input_shape, x)
        if y is not None:
            check_labels(self.net, self.input_shape, self.loss, y, count(x))
        return x

    # -- training ----------------------------------------------------------------------------------
    def step(self, x: Array, y: Array) -> StepReport:
        """One training step on a batch: forward, loss, backward, optimizer update. ``x``: the batch, or a tuple
        of arrays, one per input (``net.inputs``' order): host arrays, or on a GPU its own (CuPy, DLPack,
        ``__cuda_array_interface__``; NCHW in any float type, made NHWC there; labels checked on the host)."""
        x, y = on_device(self.device, x), host_labels(self.device, y)
        x = self._check_input(x, y)
        ex = self.session.executor(count(x), True)
        drawn = self.rng.bit_generator.state  # to replay the step (its dropout masks) for a diagnosis
        scale = None if self.scaler is None else self.scaler.scale
        report, _ = ex.run(x, np.asarray(y), train=True, rng=self.rng, step=self.steps_done + 1, loss_scale=scale)
        batch = count(x)
        if report.spilled and batch not in self._spill_told:  # once per batch size
            self._spill_told.add(batch)
            density = getattr(self.plans.get(batch), "density", None)
            text = spill_warning(self.net.name, self.steps_done + 1, report.spilled, density, self.policy)
            warnings.warn(text, RuntimeWarning, stacklevel=2)
        if self.scaler is not None:
            self.scaler.update(report.skipped)
            if report.skipped and np.isfinite(report.loss) and self.scaler.scale >= 1:
                return report  # the scaled gradients overflowed: expected now and then, the scale is lowered
        if not report.skipped:
            self.steps_done += 1
            self.skipped_in_a_row = 0
            return report
        self.skipped_in_a_row += 1
        warnings.warn(
            f"{self.net.name}: step {self.steps_done + 1}: the loss, a gradient or a running statistic is not finite; the step "
            "was skipped (nothing changed)",
            RuntimeWarning,
            stacklevel=2,
        )
        if self.skipped_in_a_row >= self.nonfinite_limit:  # the last bad batch run again, every output looked at
            rng = np.random.default_rng()
            rng.bit_generator.state = drawn
            again, _ = ex.run(x, np.asarray(y), train=True, rng=rng, step=self.steps_done + 1, check=True)
            raise nonfinite_error(self.net.name, self.skipped_in_a_row, self.steps_done, again.first_nonfinite)
        return report

    def fit(
        self,
        train: Dataset,
        epochs: int = 1,
        val: Dataset | None = None,
        *,
        batch_size: int = 64,
        shuffle: bool = True,
        progress: bool = True,
        callbacks: Sequence[Callback] = (),
        initial_epoch: int = 0,
    ) -> History:
        """Train epochs ``initial_epoch + 1`` to ``epochs`` over ``train`` (the last partial batch is dropped);
        evaluate on ``val`` after each.

        To resume a run: ``load`` its checkpoint, then ``fit(..., initial_epoch=trainer.epochs_done)``; a
        checkpoint written midway through an epoch (Ctrl-C, SIGTERM) resumes at the step it stopped after,
        with the same batches and random draws, so the resumed run ends with bitwise the weights of the run
        that was never stopped. ``progress`` shows a bar and prints a line per epoch; ``callbacks`` observe
        the loop (see :mod:`vmem.training.callbacks`, e.g. ``Checkpoint(path)``)."""
        batch_size = _fit_arguments(epochs, initial_epoch, batch_size)
        part = data_parallel.batch_share(self.group, batch_size)  # this rank's rows of every batch
        ranks, rank = (1, 0) if self.group is None else (self.group.size, self.group.rank)
        history = History()
        self.settings["batch"] = batch_size
        n_batches = train.num_batches(batch_size, drop_last=True)
        if n_batches == 0:
            raise ValueError(f"fit: {len(train)} samples make no full batch of {batch_size}")
        # every batch the run executes is planned before it starts: the training step (refused here if it
        # does not fit), and evaluation at the largest batch that fits beside the training state
        self._check_input(np.asarray(train.x[:1]), np.asarray(train.y[:1]))
        self.session.executor(share(batch_size, ranks), True)
        eval_batch = None
        if val is not None and len(val):
            eval_batch = self.session.eval_batches(len(val), self.eval_batch(len(val)))
            if progress and eval_batch < min(256, len(val)):
                print(
                    f"evaluating in batches of {eval_batch}: the largest that fits beside the training state",
                    flush=True,
                )
        progress = progress and rank == 0  # one rank speaks for all
        observers = ([ProgressBar(), PrintEpochs()] if progress else []) + [LossWatch()] + list(callbacks)
        for epoch in range(initial_epoch + 1, epochs + 1):
            for cb in observers:
                cb.on_epoch_start(self, epoch, epochs, n_batches)
            reports: list[StepReport] = []
            order = batches.epoch_order(self, len(train), batch_size, shuffle, epoch)
            ex = self.session.executor(share(batch_size, ranks), True)  # on a GPU: the next input gathered into pinned
            slots = batches.input_ring(ex, train, part)  # memory while a step runs (released before evaluation)
            try:
                for x, y in batches.epoch_batches(train, order, slots):
                    if part is not None:  # this rank's shard of the batch (every rank draws the same batches)
                        x, y = x[part], y[part]
                    for cb in observers:
                        cb.on_step_start(self)
                    reports.append(self.step(x, y))
                    self.epoch_step += 1
                    for cb in observers:
                        cb.on_step(self, reports[-1])
            finally:
                if slots:
                    ex.release_ring()  # type: ignore[union-attr]  # a ring comes from an Executor
            stats = EpochStats.of(epoch, reports)
            self.epochs_done, self.epoch_step, self.epoch_rng = epoch, 0, None
            if val is not None and eval_batch is not None:
                result = self.evaluate(val, batch_size=eval_batch)
                stats.val_loss, stats.val_accuracy = result["loss"], result["accuracy"]
            history.epochs.append(stats)
            for cb in observers:
                cb.on_epoch_end(self, stats, epochs)
        self.sync()
        for cb in observers:
            cb.on_fit_end(self, history)
        return history

    def predict(self, x: Array, batch_size: int | None = None) -> np.ndarray:
        """Logits for ``x`` (a tuple of arrays for a network of several inputs; evaluation mode: batch-norm
        running statistics, no dropout), in batches of
        ``batch_size`` (default: the largest up to 256 that fits beside the training state, see
        :meth:`eval_batch`)."""
        x = self._check_input(x, None)
        n = count(x)
        if n == 0:
            return np.zeros((0,) + tuple(self.net.output_shape(1, self.input_shape)[1:]), np.float32)
        batch_size = self.session.eval_batches(n, batch_size)
        out = []
        for start in range(0, n, batch_size):
            part = slice(start, start + batch_size)
            xb = [a[part] for a in x] if isinstance(x, list) else x[part]
            _, logits = self.session.executor(count(xb), False).run(xb, None, train=False, rng=self.rng)
            assert logits is not None  # an evaluation pass copies its output out
            out.append(logits)
        return np.concatenate(out)

    def evaluate(self, data: Dataset, batch_size: int | None = None) -> dict[str, float]:
        """Mean loss and accuracy (a fraction) on ``data`` (batches as in :meth:`predict`)."""
        if len(data) == 0:
            raise ValueError(f"{self.net.name}: evaluate: the dataset is empty")
        self._check_input(np.asarray(data.x), np.asarray(data.y))
        logits = self.predict(data.x, batch_size)
        return loss_and_accuracy(logits, np.asarray(data.y), getattr(self.loss, "ignore", None))

    # -- state ---------------------------------------------------------------------------------------
    def sync(self) -> None:
        """Copy the device's weights back into the network (``net.params``)."""
        weights = self.session.download()
        if weights is not None:
            self.net.params = weights

    def save(self, path: str | os.PathLike) -> None:
        """Write weights, optimizer state, step count, random state, the precision and the loss scaler's
        state to an .npz file (atomically). In a data-parallel run every rank calls it and rank 0 writes
        (the ranks hold the same state); the others wait until the file is there."""
        self._check_open()
        state.save(self, path)

    def load(self, path: str | os.PathLike) -> None:
        """Restore a checkpoint written by :meth:`save`. Everything is read and checked before anything
        changes: a truncated or mismatched file raises CheckpointError and leaves the trainer and the
        network untouched."""
        self._check_open()
        state.load(self, path)

    # -- lifetime ----------------------------------------------------------------------------------
    def close(self) -> None:
        """Copy weights back to the network, release device memory, and close a device the trainer made."""
        if self._closed:
            return
        self._closed = True
        try:
            self.sync()
        finally:
            self.session.release()
            if self._own_device:
                self.device.close()

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
