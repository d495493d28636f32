"""The engine under a Trainer: one network's executors, parameters and profiles on one device
(:class:`Session`), and the probe that measures the host's part of a step (:mod:`.probe`)."""

from .session import Session

__all__ = ["Session"]
