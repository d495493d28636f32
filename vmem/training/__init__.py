"""Training: the loop (:class:`Trainer`), its observers (callbacks) and checkpoints."""

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
]
