"""Training: the loop (:class:`Trainer`), its observers (callbacks) and checkpoints; a whole run as a value
(:class:`RunConfig` -> :func:`run` -> :class:`RunResult`, what ``vmem train`` carries out)."""

from .callbacks import (
    Callback,
    Checkpoint,
    CosineSchedule,
    LossWatch,
    PrintEpochs,
    ProgressBar,
    StopOnSignal,
    Terminated,
)
from .run import RunConfig, RunResult, run
from .trainer import EpochStats, History, Trainer

__all__ = [
    "Trainer",
    "History",
    "EpochStats",
    "Callback",
    "ProgressBar",
    "PrintEpochs",
    "Checkpoint",
    "CosineSchedule",
    "LossWatch",
    "StopOnSignal",
    "Terminated",
    "RunConfig",
    "RunResult",
    "run",
]
