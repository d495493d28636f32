"""The batches of an epoch as ``Trainer.fit`` runs them: their order (a permutation drawn at the epoch's start, kept
for a checkpoint written midway), and on a GPU each batch's input gathered straight into pinned host memory on a
thread of its own while the step before it runs (the executor's input ring), so that the host neither gathers
nor copies the input between steps."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Iterator

import numpy as np

if TYPE_CHECKING:
    from ..data import Dataset
    from ..runtime.executor import Executor
    from ..runtime.micro import MicroBatched
    from .trainer import Trainer

__all__ = ["epoch_order", "epoch_batches", "input_ring"]


def epoch_order(trainer: Trainer, n: int, batch_size: int, shuffle: bool, epoch: int) -> list[np.ndarray]:
    """The sample indices of each batch ``epoch`` runs: a permutation drawn from the trainer's generator at the
    epoch's start (its state kept, with the batches done, for a checkpoint written midway); resuming midway
    draws the same permutation and goes on after the batches done, from the generator's state at the save."""
    resuming = epoch == trainer.epochs_done + 1 and trainer.epoch_step > 0 and trainer.epoch_rng is not None
    if resuming:
        now = trainer.rng.bit_generator.state
        trainer.rng.bit_generator.state = trainer.epoch_rng  # type: ignore[assignment]  # not None: resuming
        order = trainer.rng.permutation(n) if shuffle else np.arange(n)
        trainer.rng.bit_generator.state = now
        first = trainer.epoch_step
    else:
        trainer.epoch_rng = dict(trainer.rng.bit_generator.state)
        order = trainer.rng.permutation(n) if shuffle else np.arange(n)
        trainer.epoch_step = first = 0
    return [order[k * batch_size : (k + 1) * batch_size] for k in range(first, n // batch_size)]


def input_ring(executor: Executor | MicroBatched, train: Dataset, part: slice | None) -> list[np.ndarray] | None:
    """The executor's pinned input arrays where ``train``'s inputs can be gathered into them as they are (one
    float32 image array of the network's input shape, each rank reading whole batches), else None."""
    from ..runtime.executor import Executor

    x = train.x
    if (
        not isinstance(executor, Executor)
        or part is not None
        or not isinstance(x, np.ndarray)
        or x.dtype != np.float32
        or x.ndim != 4
    ):
        return None
    slots = executor.input_ring()  # (a micro-batched step stages its own)
    if slots and slots[0].shape[1:] != x.shape[1:]:
        executor.release_ring()
        return None
    return slots


def _gather(x: np.ndarray, idx: np.ndarray, out: np.ndarray) -> np.ndarray:
    np.take(x, idx, axis=0, out=out, mode="clip")  # indices from a permutation: in range ("clip" is unbuffered)
    return out


def epoch_batches(train: Dataset, order: list[np.ndarray], slots: list[np.ndarray] | None) -> Iterator[tuple]:
    """(x, y) of each batch in ``order``. With ``slots`` (pinned arrays, at least two), batch k + 1's input is
    gathered into the next slot on a worker thread while the caller runs batch k's step: a slot is written
    again only after the step that read it has returned (a step waits for the device at its end)."""
    if not slots or len(slots) < 2:
        for idx in order:
            yield train.x[idx], train.y[idx]
        return
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="vmem-batches") as pool:
        pending = pool.submit(_gather, train.x, order[0], slots[0]) if order else None
        for k, idx in enumerate(order):
            assert pending is not None
            x = pending.result()
            if k + 1 < len(order):  # the next batch, gathered while this one's step runs
                pending = pool.submit(_gather, train.x, order[k + 1], slots[(k + 1) % len(slots)])
            yield x, train.y[idx]
