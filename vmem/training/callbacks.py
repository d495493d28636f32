"""Observers of the training loop (Chainer's extensions): progress bars, printed metrics, checkpoints.

:meth:`vmem.Trainer.fit` calls each callback's hooks; none of them changes the step. ``progress=True``
(the default) adds :class:`ProgressBar` and :class:`PrintEpochs`; pass others with ``callbacks=``.
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..distributed.group import ProcessGroup
    from ..runtime import StepReport
    from .trainer import EpochStats, History, Trainer

__all__ = [
    "Callback",
    "ProgressBar",
    "PrintEpochs",
    "Checkpoint",
    "CosineSchedule",
    "LossWatch",
    "StopOnSignal",
    "Terminated",
]


class Callback:
    """Hooks of :meth:`vmem.Trainer.fit`; each does nothing unless overridden."""

    def on_epoch_start(self, trainer: "Trainer", epoch: int, epochs: int, batches: int) -> None:
        pass

    def on_step_start(self, trainer: "Trainer") -> None:
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
        try:  # a terminal that reports no size (0 x 0) would hide the bar: give it 80 x 24
            sized = os.get_terminal_size(sys.stderr.fileno()).columns > 0
        except (OSError, ValueError, AttributeError):
            sized = False
        bar = tqdm(
            total=batches,
            desc=f"epoch {epoch}/{epochs}",
            leave=False,
            dynamic_ncols=sized,
            ncols=None if sized else 80,
            nrows=None if sized else 24,
            disable=None,
        )
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
        extra = (
            f"  val loss {stats.val_loss:.4f}  val accuracy {stats.val_accuracy:.2%}"
            if stats.val_accuracy is not None
            else ""
        )
        print(
            f"epoch {stats.epoch}/{epochs}  loss {stats.train_loss:.4f}{extra}  step {stats.step_seconds * 1e3:.1f} ms",
            flush=True,
        )


class Checkpoint(Callback):
    """Save the trainer to ``path`` after every epoch (atomically), so an interruption loses at most one.

    A save that fails (a full disk, diverged weights) is said in one line and training goes on; the last
    good checkpoint stays, and :attr:`failed` holds the message of the last save if it failed (None once a
    later save succeeds), so that a caller can say so in its exit status."""

    def __init__(self, path: str | os.PathLike):
        self.path = path
        self.failed: str | None = None

    def on_epoch_end(self, trainer: "Trainer", stats: "EpochStats", epochs: int) -> None:
        from ..errors import CheckpointError

        try:
            trainer.save(self.path)
        except CheckpointError as exc:
            self.failed = str(exc)
            print(f"checkpoint: {exc}", file=sys.stderr, flush=True)
        else:
            self.failed = None


class CosineSchedule(Callback):
    """Decay the optimizer's learning rate from its value at the start of ``fit`` to ``floor`` times it,
    along half a cosine over the epochs (set at the start of each epoch), so that training settles
    instead of wandering at the end."""

    def __init__(self, floor: float = 0.0):
        self.floor = floor
        self.base: float | None = None

    def on_epoch_start(self, trainer: "Trainer", epoch: int, epochs: int, batches: int) -> None:
        if self.base is None:
            self.base = trainer.optimizer.lr
        scale = self.floor + (1 - self.floor) * 0.5 * (1 + math.cos(math.pi * (epoch - 1) / epochs))
        trainer.optimizer.lr = self.base * scale

    def on_fit_end(self, trainer: "Trainer", history: "History") -> None:
        if self.base is not None:
            trainer.optimizer.lr = self.base  # the optimizer as it was given
        self.base = None


class LossWatch(Callback):
    """Warn once when the training loss becomes non-finite, or an epoch's mean loss is above ``jump`` times
    the least seen so far: the best earlier epoch's, or in the first epoch its first step's (a learning
    rate so high that training diverges from the start never has a good epoch to compare with)."""

    def __init__(self, jump: float = 3.0):
        self.jump = jump
        self.best = math.inf
        self.first: float | None = None
        self.warned = False

    def on_step(self, trainer: "Trainer", report: "StepReport") -> None:
        if self.first is None and math.isfinite(report.loss):
            self.first = report.loss
        if not self.warned and not math.isfinite(report.loss):
            self._warn(f"the training loss became {report.loss} at step {trainer.steps_done}")

    def on_epoch_end(self, trainer: "Trainer", stats: "EpochStats", epochs: int) -> None:
        loss = stats.train_loss
        least = min(self.best, math.inf if self.first is None else self.first)
        if not self.warned and math.isfinite(loss) and math.isfinite(least) and loss > self.jump * max(least, 1e-12):
            since = "the best epoch's" if self.best == least else "the first step's"
            self._warn(f"the training loss rose to {loss:.4g} in epoch {stats.epoch} ({since}: {least:.4g})")
        if math.isfinite(loss):
            self.best = min(self.best, loss)

    def _warn(self, what: str) -> None:
        self.warned = True
        warnings.warn(f"{what}: training is diverging; lower the learning rate", RuntimeWarning, stacklevel=3)


class Terminated(KeyboardInterrupt):
    """SIGTERM (what batch schedulers and ``timeout`` send before they kill a job), handled as Ctrl-C is:
    the run saves what it has and the command exits with 143 (130 for Ctrl-C)."""


class StopOnSignal(Callback):
    """Ctrl-C (SIGINT) and SIGTERM stop whatever runs within about a second, and a training step in flight
    after it finishes (a step cut short may have updated some weights and not others, and could not be
    resumed exactly).

    Used as a context manager (in the main thread; elsewhere it does nothing) that installs the handlers,
    and as a callback of :meth:`vmem.Trainer.fit`, which tells it when a step starts and ends. Outside a
    step (profiling, planning, loading data, evaluating, checking) a signal raises at once, as
    :class:`KeyboardInterrupt` or :class:`Terminated`. Inside one, the first signal is noted (one line on
    stderr) and raised when the step ends; a second raises at once and sets :attr:`cut` (the weights are
    then half-updated: save nothing).

    On the ranks of a data-parallel run (``group``), a rank that stopped alone would leave the others
    waiting in a collective, so from the first epoch to the end of ``fit`` every signal is held to the end
    of the step, and the ranks agree after every step whether any was signalled: all stop after the same
    step (and rank 0 writes the checkpoint the others would)."""

    def __init__(self, group: ProcessGroup | None = None) -> None:
        self.pending: KeyboardInterrupt | None = None
        #: a second signal stopped a step midway (its update may be partial)
        self.cut = False
        #: the stop was raised after a step, on every rank alike (not by one rank alone, outside training)
        self.agreed = False
        #: whether the run saved what it had trained when this stopped it (vmem.training.run sets it)
        self.saved = False
        self.group = group
        self._in_step = False
        self._training = False
        self._before: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        import signal

        stop = Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()
        holding = self._in_step or (self.group is not None and self._training)
        if holding and self.pending is None:
            self.pending = stop
            if self.group is None or self.group.rank == 0:  # one rank speaks for all
                print("\nstopping after this step (again to stop at once)", file=sys.stderr, flush=True)
            return
        if self._in_step:
            self.cut = True
        raise stop

    def on_epoch_start(self, trainer: "Trainer", epoch: int, epochs: int, batches: int) -> None:
        self._training, self._in_step = True, False

    def on_step_start(self, trainer: "Trainer") -> None:
        self._in_step = True

    def on_step(self, trainer: "Trainer", report: "StepReport") -> None:
        self._in_step = False
        if self.group is not None:
            import numpy as np

            flags = np.array([0.0 if self.pending is None else 1.0 + isinstance(self.pending, Terminated)])
            self.group.allreduce(flags)  # every rank's, summed: any rank signalled stops them all
            if flags[0] and self.pending is None:
                self.pending = Terminated() if flags[0] >= 2 else KeyboardInterrupt()
        if self.pending is not None:
            self.agreed = True
            raise self.pending

    def on_fit_end(self, trainer: "Trainer", history: "History") -> None:
        self._training = False

    def __enter__(self) -> "StopOnSignal":
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._before[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        import signal

        for sig, before in self._before.items():
            signal.signal(sig, before)
        self._before.clear()
