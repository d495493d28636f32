"""A training run as a value: :class:`RunConfig` (everything ``vmem train`` decides, checked once, plain data,
recorded in the run's checkpoints), :func:`run` (the config carried out: the model, its data, the budget, a
Trainer's fit, the checkpoints) and :class:`RunResult` (what came of it, as plain data or as ``vmem train``'s
text). ``vmem train`` parses its options into a RunConfig, calls ``run`` and prints the result (``--json``:
its plain data); from Python the same run is one call::

    result = vmem.training.run(vmem.training.RunConfig(model="digits_vgg", epochs=2, save="ckpt.npz"))
    print(result.val_accuracy, result.peak_bytes)

On the ranks of an MPI job (``vmem train --nproc N``, or ``mpiexec`` running a script), pass the job's group
(``vmem.distributed.init()``): each rank trains on its share of every batch."""

from __future__ import annotations

import contextlib
import dataclasses
import time
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ContextManager

from ..distributed.group import share
from ..errors import VmemError
from ..units import format_bytes, printable
from .setup import auto_fraction, auto_memory, budget_line, check_dataset, check_memory, math_option, model
from .callbacks import StopOnSignal
from .setup import open_device, rebuild_for_classes

if TYPE_CHECKING:
    from ..data import Dataset
    from ..device.base import Device
    from ..distributed.group import ProcessGroup
    from ..graph.network import Network
    from ..optim import Optimizer
    from .callbacks import Callback, Checkpoint
    from .trainer import History, Trainer

__all__ = ["RunConfig", "RunResult", "run", "prepare", "TRAIN_DEFAULTS", "DATASETS"]

#: ``vmem train``'s defaults where a model has none of its own (``net.train_defaults``).
TRAIN_DEFAULTS: dict[str, int | float | str] = {"batch": 32, "epochs": 10, "optimizer": "sgd", "lr": 0.05}
DATASETS = ("digits", "synthetic", "reverse")
#: what a checkpoint records of its run's config: everything but where files go and what resuming allows
_NOT_RECORDED = ("save", "resume", "resume_anyway")


@dataclass(frozen=True)
class RunConfig:
    """Everything a training run decides (``vmem train``'s options, by the same names). ``batch``, ``epochs``,
    ``optimizer`` and ``lr`` left None take the model's own defaults, else :data:`TRAIN_DEFAULTS`
    (:func:`prepare` fills them); ``policy`` is a spec (``"auto"``, ``"vdnn-all:algos=memory"``);
    ``memory`` a size (``"256MiB"``), ``"auto[:FRACTION]"`` (that fraction of what the baseline policy needs;
    left None under a policy made for a budget, ``auto:0.5``) or None. Checked when made: a bad value is a
    ValueError naming the option."""

    model: str | None = "digits_vgg"
    onnx: str | None = None
    image_size: int | None = None
    depth: int | None = None
    dataset: str = "digits"
    batch: int | None = None
    epochs: int | None = None
    optimizer: str | None = None
    lr: float | None = None
    momentum: float = 0.9
    weight_decay: float = 0.0
    schedule: str = "cosine"
    seed: int = 0
    policy: str = "auto"
    memory: str | None = None
    device: str = "cpu"
    math: str | None = None
    precision: str = "fp32"
    save: str | None = None
    resume: str | None = None
    resume_anyway: bool = False
    shard_optimizer: bool = False
    nproc: int = 1

    def __post_init__(self) -> None:
        choices = {
            "dataset": DATASETS,
            "schedule": ("cosine", "constant"),
            "optimizer": ("sgd", "adam", None),
            "precision": ("fp32", "fp16", "bf16"),
            "math": ("tf32", "exact", None),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                shown = ", ".join(str(a) for a in allowed if a is not None)
                raise ValueError(f"RunConfig: {name}={getattr(self, name)!r}; use one of {shown}")
        for name in ("image_size", "depth", "batch", "epochs", "nproc"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"RunConfig: {name}={value!r} must be a positive int")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ValueError(f"RunConfig: seed={self.seed!r} must be an int >= 0")
        if self.lr is not None and not self.lr > 0:
            raise ValueError(f"RunConfig: lr={self.lr!r} must be positive")
        if self.momentum < 0 or self.weight_decay < 0:
            raise ValueError("RunConfig: momentum and weight_decay must be >= 0")
        if (self.model is None) == (self.onnx is None):
            raise ValueError("RunConfig: give a zoo model (model=) or an ONNX file (onnx=), one of them")

    def to_dict(self) -> dict[str, object]:
        """The config as plain data (:meth:`from_dict` makes it again)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunConfig":
        """A config from :meth:`to_dict`'s data; an unknown key is a ValueError naming it."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"RunConfig: no option {', '.join(map(repr, unknown))}")
        return cls(**data)

    def recorded(self) -> dict[str, object]:
        """What a checkpoint keeps of the run (all but where files go and whether resuming may differ)."""
        return {k: v for k, v in self.to_dict().items() if k not in _NOT_RECORDED}


@dataclass(frozen=True)
class RunResult:
    """What a run came to (``vmem train --json`` prints :meth:`to_dict`; its text is :meth:`lines`)."""

    model: str
    dataset: str
    policy: str
    device: str
    memory: int | str | None
    baseline_peak_bytes: int | None
    batch: int
    epochs: int
    seed: int
    train_loss: float
    val_loss: float | None
    val_accuracy: float | None
    step_seconds: float
    peak_bytes: int
    average_bytes: float
    offloaded_bytes: int
    stall_seconds: float
    wall_seconds: float
    history: list[dict[str, object]]
    chosen: str | None
    reason: str | None
    profile_notes: list[str] = field(default_factory=list)
    profile_kept: bool | None = None
    save_failed: str | None = None
    config: dict[str, object] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    def lines(self) -> list[str]:
        """The run's summary as ``vmem train`` prints it."""
        out = [
            f"done in {self.wall_seconds:.1f} s: val accuracy {self.val_accuracy or 0.0:.2%}, train loss "
            f"{self.train_loss:.4f}, step time {self.step_seconds * 1e3:.1f} ms (median), peak device memory "
            f"{format_bytes(self.peak_bytes)} (average {format_bytes(self.average_bytes)})"
        ]
        if self.baseline_peak_bytes is not None:
            needs = self.baseline_peak_bytes
            out.append(
                f"used {format_bytes(self.peak_bytes)} of device memory at the peak: "
                f"{self.peak_bytes / needs:.2f}x the {format_bytes(needs)} the baseline policy needs"
            )
        if self.offloaded_bytes:
            out.append(
                f"offloaded {format_bytes(self.offloaded_bytes)} a step to pinned host memory; "
                f"compute waited {self.stall_seconds * 1e3:.1f} ms a step for the memory stream"
            )
        if self.chosen and self.reason:
            out.append(self.reason)
        out += [f"profile: {note}" for note in self.profile_notes]
        return out


def prepare(config: RunConfig, ranks: int = 1) -> tuple[RunConfig, Network, Dataset, Dataset]:
    """What a run can check in a moment, before it profiles, plans or launches ranks: the model, its
    defaults, the dataset against the model and the batch, the ranks against the batch and the cores, the
    memory against the device, the resumed checkpoint against the network and the run. Returns the config
    with the model's defaults filled, the network and the training and validation sets."""
    from .. import data, distributed
    from ..threads import cores

    net = model(config)
    check_dataset(config, net)
    defaults = {**TRAIN_DEFAULTS, **getattr(net, "train_defaults", {})}
    config = dataclasses.replace(config, **{k: v for k, v in defaults.items() if getattr(config, k) is None})
    assert config.batch is not None
    if ranks > 1 and config.batch % ranks:
        raise ValueError(
            f"--batch {config.batch} does not split into {ranks} equal shards, one a rank; give a multiple of {ranks}"
        )
    if ranks > 1 and not distributed.launched() and ranks > cores():
        raise ValueError(f"--nproc {ranks}: this machine has {cores()} cores for its ranks; give at most {cores()}")
    check_memory(config)
    train, val = data.load(config.dataset, input_shape=net.input_shape, seed=config.seed)
    if config.batch > len(train):
        raise ValueError(
            f"--batch {config.batch} is more than the {len(train)} training samples of {config.dataset}; give at "
            f"most {len(train)}"
        )
    if train.num_classes != net.output_shape()[-1]:
        net = rebuild_for_classes(config, train.num_classes, net)
    if config.resume:
        _check_resume(config, net)
    return config, net, train, val


def _optimizer(config: RunConfig) -> Optimizer:
    """The run's optimizer, as ``optimizer``, ``lr``, ``momentum`` and ``weight_decay`` ask (the defaults filled:
    :func:`prepare`)."""
    from .. import optim

    assert config.lr is not None  # filled by prepare
    if config.optimizer == "adam":
        return optim.Adam(lr=config.lr, weight_decay=config.weight_decay)
    return optim.SGD(lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)


def _check_resume(config: RunConfig, net: Network) -> None:
    """The resumed checkpoint, checked before any work: a readable vmem checkpoint of this network that has
    epochs left to train; every setting of this run that differs from its run named in a warning; a
    different batch midway through an epoch refused unless ``resume_anyway``."""
    from . import checkpoint

    assert config.resume is not None and config.epochs is not None
    meta = checkpoint.check(config.resume, net.name)
    # its arrays against this run's network (its image size, its classes) and optimizer, before any profiling
    checkpoint.read(config.resume, net.name, _optimizer(config), net.param_specs(net.input_shape))
    done = meta.get("epochs_done", 0)
    if isinstance(done, int) and done >= config.epochs:
        raise ValueError(
            f"--resume {config.resume}: it has trained {done} epochs already; ask for more with --epochs (now "
            f"{config.epochs})"
        )
    kept = checkpoint.settings(meta)
    now = {
        "math": config.math or kept.get("math"),  # the device's default where not asked for
        "precision": config.precision,
        "batch": config.batch,
        "seed": config.seed,
        "lr": config.lr,
        "policy": config.policy,
    }
    differ = [k for k in now if k in kept and kept[k] != now[k]]
    if kept.get("precision") is None and meta.get("precision", "fp32") != config.precision:
        kept["precision"] = meta.get("precision", "fp32")
        differ.insert(0, "precision")
    if not differ:
        return
    what = ", ".join(f"{printable(str(k))} {printable(str(kept[k]))}" for k in differ)
    this = ", ".join(f"{k} {now[k]}" for k in differ)
    if "batch" in differ and meta.get("epoch_step", 0) and not config.resume_anyway:
        raise ValueError(
            f"--resume {config.resume}: it stopped midway through an epoch at batch {kept['batch']}; this run's "
            f"batch {config.batch} would draw other batches for the rest of it. Give --batch {kept['batch']}, or "
            "--resume-anyway"
        )
    warnings.warn(f"--resume {config.resume} was trained with {what}; this run: {this}", stacklevel=3)


def run(
    config: RunConfig,
    *,
    group: ProcessGroup | None = None,
    stop: Callback | None = None,
    progress: Callable[[str], None] | None = None,
    slow: Callable[[str], ContextManager[object]] | None = None,
) -> RunResult:
    """Carry out ``config`` (see the module docstring) and return what came of it. ``group``: the ranks of a
    data-parallel job (each trains on its share of every batch; rank 0 writes the checkpoints); ``stop``: a
    callback of the fit's that ends it after a step (a signal's, :class:`~vmem.training.callbacks.StopOnSignal`;
    where it ends the run, what was trained so far is saved and KeyboardInterrupt raised); ``progress(line)``
    hears what the run is doing (none: it trains quietly); ``slow(what)``: a context for a long stage (the
    profile). A failed save ends the run as it is, ``save_failed`` saying why."""
    import numpy as np

    from .trainer import Trainer

    ranks = 1 if group is None else group.size
    config, net, train, val = prepare(dataclasses.replace(config, nproc=ranks), ranks)  # the ranks it runs on
    assert config.batch is not None and config.epochs is not None
    say = progress or (lambda line: None)
    local_batch = share(config.batch, ranks)  # what each rank runs
    fraction = auto_fraction(config.memory, config.policy)
    memory: int | str | None = config.memory
    needs, raised = None, False
    if fraction is not None:  # a budget below what the baseline needs (at each rank's batch): what vmem is for
        memory, needs, raised = auto_memory(
            dataclasses.replace(config, batch=local_batch), net, fraction, config.policy
        )
    t0 = time.perf_counter()
    # a math mode asked for: the device opened here with it (and closed after the Trainer)
    opened: ContextManager[Device | str] = (
        contextlib.nullcontext(config.device)
        if config.math is None
        else open_device(config.device, memory, **math_option(config))
    )
    with (
        opened as device,
        Trainer(
            net,
            device=device,
            memory=memory if config.math is None else None,
            policy=config.policy,
            optimizer=_optimizer(config),
            seed=config.seed,
            precision=config.precision,
            group=group,
            shard_optimizer=config.shard_optimizer,
        ) as trainer,
    ):
        trainer.settings["run"] = config.recorded()  # kept in its checkpoints
        say(
            f"training {net.name} on {config.dataset} ({len(train)} train / {len(val)} val), batch {config.batch}"
            + (f" on {ranks} ranks ({local_batch} each)" if ranks > 1 else "")
            + f", policy {trainer.policy.spec}, device {trainer.device!r}"
        )
        if needs is not None and fraction is not None and isinstance(memory, int):
            say(budget_line(memory, needs, fraction, raised, config.policy, local_batch))
        history, saver = _fit(config, trainer, train, val, local_batch, stop, say, slow, progress is not None)
        planned = trainer.plans.get(local_batch)
        costs = trainer.costs.get(local_batch)
        kept = trainer.session.kept.get(local_batch) if trainer.profiling else None
    last = history.last
    return RunResult(
        model=net.name,
        dataset=config.dataset,
        policy=config.policy,
        device=config.device,
        memory=memory,
        baseline_peak_bytes=needs,
        batch=config.batch,
        epochs=config.epochs,
        seed=config.seed,
        train_loss=last.train_loss,
        val_loss=last.val_loss,
        val_accuracy=last.val_accuracy,
        step_seconds=float(np.median([e.step_seconds for e in history.epochs])),
        peak_bytes=max(e.peak_bytes for e in history.epochs),
        average_bytes=float(np.mean([e.average_bytes for e in history.epochs])),
        offloaded_bytes=max(e.offloaded_bytes for e in history.epochs),
        stall_seconds=float(np.mean([e.stall_seconds for e in history.epochs])),
        wall_seconds=time.perf_counter() - t0,
        history=history.to_dict(),
        chosen=planned.chosen if planned is not None else None,
        reason=planned.reason if planned is not None else None,
        profile_notes=list(getattr(costs, "notes", [])),
        profile_kept=kept,
        save_failed=saver.failed if saver is not None else None,
        config=config.to_dict(),
    )


def _fit(
    config: RunConfig,
    trainer: Trainer,
    train: Dataset,
    val: Dataset,
    local_batch: int,
    stop: Callback | None,
    say: Callable[[str], None],
    slow: Callable[[str], ContextManager[object]] | None,
    bars: bool,
) -> tuple[History, Checkpoint | None]:
    """The run's profile, its resumed state, and its fit with the checkpoints and the stop; what the stopped
    fit trained so far saved before KeyboardInterrupt goes on. (The fit's history, its checkpoint callback.)"""
    from . import Checkpoint, CosineSchedule

    assert config.epochs is not None and config.batch is not None
    schedule = [CosineSchedule()] if config.schedule == "cosine" else []
    saver = Checkpoint(config.save) if config.save else None
    if trainer.profiling:  # measured once per program, device and machine, then kept (vmem.costs.cache)
        from ..planning.profiles import profile_line

        program = trainer.net.build(local_batch, trainer.input_shape, precision=config.precision)
        what = (
            f"profiling {len(program.ops)} layers of {trainer.net.name} at batch {local_batch} on "
            f"{trainer.device.name} (every pass and algorithm)"
        )
        with slow(what) if slow is not None else contextlib.nullcontext():
            profiled_at = time.perf_counter()
            trainer.profile(local_batch)
        say(profile_line(trainer.session.kept.get(local_batch, False), time.perf_counter() - profiled_at))
    initial = 0
    if config.resume:
        trainer.load(config.resume)
        initial = trainer.epochs_done
        say(
            f"resuming {config.resume}: {initial} epochs and {trainer.epoch_step} steps of the next done "
            f"({trainer.steps_done} steps)"
        )
    try:
        history = trainer.fit(
            train,
            epochs=config.epochs,
            val=val,
            batch_size=config.batch,
            progress=bars,
            callbacks=schedule + ([saver] if saver else []) + ([stop] if stop is not None else []),
            initial_epoch=initial,
        )
    except KeyboardInterrupt:
        # what the interrupted epoch did so far, on top of the last whole epoch; nothing where a second
        # signal cut a step short (its update may be partial: the last checkpoint stays)
        if config.save and not getattr(stop, "cut", False):
            try:
                trainer.save(config.save)
                if isinstance(stop, StopOnSignal):  # it says so (vmem train's last line)
                    stop.saved = True
            except VmemError as exc:
                warnings.warn(str(exc), stacklevel=2)
        raise
    return history, saver
