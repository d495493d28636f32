"""The host's part of a step, measured: what a profile's prediction adds to its ops where the device's
streams wait for the host (the CPU device, whose stream workers share the interpreter's lock with it).

A step on such a device costs, beyond its ops and copies, the host's enqueueing of its schedule (the
streams start once it is in: see ``Device.dispatch_scope``) and each stream item's own handling (taking it
from the queue, timing it). Both are per step of the schedule and per item, whatever the layer's size, so
they are measured on a small network: a few convolutions under ``vdnn-all`` (every kind of step the
executor enqueues: allocations, ops, offloads, prefetches and their waits), on the device itself, once per
process and device. :func:`overheads` gives them; the session puts them in its profile
(``Profiled.dispatch``), and the replay adds them (see ``CostModel.host_overheads``).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import numpy as np

from ..errors import VmemError

__all__ = ["overheads"]

_log = logging.getLogger("vmem.profile")
_MEASURED: dict[str, tuple[float, float]] = {}
_LOCK = threading.Lock()
#: steps of the small network measured (after as many to warm up); their medians are taken
STEPS = 9


def _network() -> Any:
    from .. import nn
    from ..graph import Sequential

    return Sequential(
        nn.Conv2d(2, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Conv2d(4, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(4, 4, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(64, 4),
        input_shape=(2, 8, 8),
        name="dispatch-probe",
    )


def overheads(device: Any, trainer: Any) -> tuple[float, float]:
    """(seconds the host takes to enqueue one schedule step, seconds a stream takes per item besides its
    work) on ``device``, from a small network's steps there under ``trainer`` (the Trainer class; its
    blocks are given back after); (0, 0) where the device runs while the host enqueues (an asynchronous
    one: a GPU) or the probe cannot run."""
    if device.asynchronous or not device.holds_data:
        return 0.0, 0.0
    with _LOCK:
        kept = _MEASURED.get(device.name)
        if kept is None:
            kept = _MEASURED[device.name] = _measure(device, trainer)
    return kept


def _measure(device: Any, Trainer: Any) -> tuple[float, float]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 2, 8, 8)).astype(np.float32)
    y = rng.integers(0, 4, 4)
    try:
        with Trainer(_network(), device=device, policy="vdnn-all", profile=False, seed=0) as trainer:
            reports = [trainer.step(x, y) for _ in range(2 * STEPS)][STEPS:]
            steps = len(trainer.session.executor(4, True).schedule.steps)
    except VmemError as exc:  # too little room left on the device, say: the prediction counts ops alone
        _log.info("dispatch probe: not run (%s); the host's part of a step is not predicted", exc)
        return 0.0, 0.0
    per_step = float(np.median([r.dispatch_seconds for r in reports])) / steps
    per_item = float(np.median([_gaps(r) for r in reports]))
    _log.info("dispatch probe: %.1f us per schedule step, %.1f us per stream item", per_step * 1e6, per_item * 1e6)
    return per_step, per_item


def _gaps(report: Any) -> float:
    """The compute stream's mean time between one item's end and the next one's start."""
    spans = sorted((s for s in report.spans if s.stream == "compute"), key=lambda s: s.start)
    if len(spans) < 2:
        return 0.0
    return sum(max(0.0, b.start - a.end) for a, b in zip(spans, spans[1:])) / (len(spans) - 1)
