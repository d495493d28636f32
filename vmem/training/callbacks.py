"""Observers of the training loop (Chainer's extensions): progress bars, printed metrics, checkpoints.

:meth:`vmem.Trainer.fit` calls each callback's hooks; none of them changes the step. ``progress=True``
(the default) adds :class:`ProgressBar` and :class:`PrintEpochs`; pass others with ``callbacks=``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..runtime import StepReport
    from .trainer import EpochStats, History, Trainer

__all__ = ["Callback", "ProgressBar", "PrintEpochs", "Checkpoint"]


class Callback:
    """Hooks of :meth:`vmem.Trainer.fit`; each does nothing unless overridden."""

    def on_epoch_start(self, trainer: "Trainer", epoch: int, epochs: int, batches: int) -> None:
        pass

    def on_step(self, trainer: "Trainer", report: "StepReport") -> None:
        pass

    def on_epoch_end(self, trainer: "Trainer", stats: "EpochStats", epochs: int) -> None:
        pass

    def on_fit_end(self, trainer: "Trainer", history: "History") -> None:
        pass


class ProgressBar(Callback):
    """A tqdm bar per epoch with the last loss (only on a terminal, and only if tqdm is installed)."""

    def __init__(self) -> None:
        self.bar: Any = None

    def on_epoch_start(self, trainer: "Trainer", epoch: int, epochs: int, batches: int) -> None:
        try:
            from tqdm.auto import tqdm
        except ImportError:
            return
        bar = tqdm(total=batches, desc=f"epoch {epoch}/{epochs}", leave=False, dynamic_ncols=True, disable=None)
        self.bar = None if bar.disable else bar  # disable=None: off unless a terminal

    def on_step(self, trainer: "Trainer", report: "StepReport") -> None:
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{report.loss:.4f}")

    def on_epoch_end(self, trainer: "Trainer", stats: "EpochStats", epochs: int) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class PrintEpochs(Callback):
    """One line per epoch: loss, validation loss and accuracy, median step time."""

    def on_epoch_end(self, trainer: "Trainer", stats: "EpochStats", epochs: int) -> None:
        extra = (f"  val loss {stats.val_loss:.4f}  val accuracy {stats.val_accuracy:.2%}"
                 if stats.val_accuracy is not None else "")
        print(f"epoch {stats.epoch}/{epochs}  loss {stats.train_loss:.4f}{extra}  "
              f"step {stats.step_seconds * 1e3:.1f} ms", flush=True)


class Checkpoint(Callback):
    """Save the trainer to ``path`` after every epoch (atomically), so an interruption loses at most one."""

    def __init__(self, path: str | os.PathLike):
        self.path = path

    def on_epoch_end(self, trainer: "Trainer", stats: "EpochStats", epochs: int) -> None:
        trainer.save(self.path)
