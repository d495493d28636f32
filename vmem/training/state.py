"""A Trainer's state in and out of a checkpoint (:mod:`.checkpoint` writes and reads the file): the weights,
the optimizer's state (gathered from the ranks that keep its shares), where the run is (steps, epochs, the
random generators), the precision and loss scale, the settings and the plans the run used."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np

from ..distributed import data_parallel
from . import checkpoint

if TYPE_CHECKING:
    from .trainer import Trainer

__all__ = ["save", "load", "optimizer_state"]


def save(trainer: "Trainer", path: str | os.PathLike) -> None:
    """``trainer``'s state to ``path`` (atomically); every rank of a data-parallel run calls it, rank 0
    writes and the others wait until the file is there."""
    whole = optimizer_state(trainer)  # every rank takes part where the state is sharded
    data_parallel.written_by_rank_0(trainer.group, lambda: _write(trainer, path, whole))


def optimizer_state(trainer: "Trainer") -> dict[str, np.ndarray]:
    """The optimizer's whole state on the host (every rank calls this, in step: where the state is sharded
    over the ranks, each parameter's comes from the rank that keeps it)."""
    own = trainer.session.device_params().optimizer_state()
    if not trainer.session.shard_optimizer or trainer.group is None:
        return own
    net = trainer.net
    program = net.build(1, trainer.input_shape, trainer.dtype, trainer.precision)
    specs = net.param_specs(trainer.input_shape)
    return data_parallel.gathered_optimizer_state(trainer.group, own, program, specs, trainer.optimizer.slots)


def _write(trainer: "Trainer", path: str | os.PathLike, optimizer_state: dict[str, np.ndarray]) -> None:
    trainer.session.device_params()  # made (and the weights uploaded) before they are read back
    trainer.sync()
    meta: dict[str, Any] = {
        "network": trainer.net.name,
        "optimizer": trainer.optimizer.config(),
        "steps": trainer.steps_done,
        "rng": trainer.rng.bit_generator.state,
        "dtype": trainer.dtype,
        "epochs_done": trainer.epochs_done,
        "epoch_step": trainer.epoch_step,
        "epoch_rng": trainer.epoch_rng,
        "precision": trainer.precision,
        "scaler": trainer.scaler.state_dict() if trainer.scaler is not None else None,
        "settings": trainer.settings,
        # the plans the run used (policy, algorithms, what was offloaded, recomputed or encoded), without
        # their measured text (reasons with predicted times), so that the same run writes the same bytes
        "plans": {
            str(b): {k: v for k, v in p.plan.to_dict().items() if k not in ("reason", "notes")}
            for b, p in trainer.plans.items()
        },
    }
    checkpoint.write(path, trainer.net.params, optimizer_state, meta)  # type: ignore[arg-type]


def load(trainer: "Trainer", path: str | os.PathLike) -> None:
    """``trainer`` restored from ``path``; everything is read and checked before anything changes (a
    truncated or mismatched file raises CheckpointError and leaves the trainer and the network untouched)."""
    net = trainer.net
    ckpt = checkpoint.read(path, net.name, trainer.optimizer, net.param_specs(trainer.input_shape))
    before = net.params
    net.load_state_dict(ckpt.params, source=str(path))  # checks names, shapes, dtypes; raises first
    try:
        device_params = trainer.session.device_params()
        trainer.device.synchronize()
        device_params.upload(net.params)  # type: ignore[arg-type]
        device_params.load_optimizer_state(
            {k: v for k, v in ckpt.optimizer_state.items() if k in device_params.optimizer_keys()}
        )  # where the state is sharded: this rank's share
    except BaseException:
        net.params = before
        raise
    trainer.steps_done = int(ckpt.steps)
    trainer.rng = ckpt.rng
    trainer.epochs_done, trainer.epoch_step, trainer.epoch_rng = ckpt.epochs_done, ckpt.epoch_step, ckpt.epoch_rng
    if trainer.scaler is not None and ckpt.scaler is not None:  # fp16 goes on at the scale it had reached
        trainer.scaler.load_state_dict(ckpt.scaler)
