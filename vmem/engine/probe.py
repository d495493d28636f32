"""The host's part of a step, measured: what a profile's prediction adds to its ops where the device's
streams wait for the host (the CPU device, whose stream workers share the interpreter's lock with it).

A step on such a device costs, beyond its ops and copies, the host's enqueueing of its schedule (the
streams start once it is in: see ``Device.dispatch_scope``) and each stream item's own handling (taking it
from the queue, timing it). Both are per step of the schedule and per item, whatever the layer's size, so
they are measured on a small network: a few convolutions under ``vdnn-all`` (every kind of step the
executor enqueues: allocations, ops, offloads, prefetches and their waits), on the device itself, once per
process and device. A third part is what each copy on the memory stream costs the compute stream: the
streams' workers share the host's cores and the interpreter's lock, so an op slows while a copy runs
beside it and waits for the lock after it; it is the time the offloading steps take beyond the same
network's layer-wise steps (the same ops, no copies), per copy. :func:`overheads` gives the three; the
session puts them in its profile (``Profiled.dispatch``), and the replay adds them (see
``CostModel.host_overheads``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..device.base import Device
    from ..schedule.steps import Schedule

import logging
import threading
from typing import Any

import numpy as np

from ..errors import VmemError

__all__ = ["overheads"]

_log = logging.getLogger("vmem.profile")
_MEASURED: dict[str, tuple[float, float, float]] = {}
_LOCK = threading.Lock()
#: steps of the small network measured (after as many to warm up); their medians are taken
STEPS = 15
#: turns of the two plans (see _measure)
ROUNDS = 2
#: the probe's offloading plan: every map copied out and back, released on the memory stream (as the
#: plans that overlap copies with compute do)
OFFLOADING = "vdnn-all:sync=event"


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


def overheads(device: Device) -> tuple[float, float, float]:
    """(seconds the host takes to enqueue one schedule step, seconds a stream takes per item besides its
    work, seconds the compute stream loses to each copy the memory stream runs) on ``device``, from a
    small network's steps there, run by a :class:`~vmem.engine.session.Session`'s executors as a training
    step runs (its blocks given back after); zeros where the device runs while the host enqueues (an
    asynchronous one: a GPU) or the probe cannot run."""
    if device.asynchronous or not device.holds_data:
        return 0.0, 0.0, 0.0
    with _LOCK:
        kept = _MEASURED.get(device.name)
        if kept is None:
            kept = _MEASURED[device.name] = _measure(device)
    return kept


def _measure(device: Device) -> tuple[float, float, float]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 2, 8, 8)).astype(np.float32)
    y = rng.integers(0, 4, 4)
    runs: dict[str, list[Any]] = {"layerwise": [], OFFLOADING: []}  # the reports of each plan's steps
    schedule: Schedule | None = None  # the offloading plan's schedule
    try:
        for _ in range(ROUNDS):  # in turns, so that neither runs only while the process is cold
            for policy, reports in runs.items():
                session = _session(device, policy)
                try:
                    executor = session.executor(4, True)
                    steps = [executor.run(x, y, train=True, rng=rng, step=k + 1)[0] for k in range(2 * STEPS)]
                    reports.extend(steps[STEPS:])
                    schedule = executor.schedule if policy == OFFLOADING else schedule
                finally:
                    session.release()
    except VmemError as exc:  # too little room left on the device, say: the prediction counts ops alone
        _log.info("dispatch probe: not run (%s); the host's part of a step is not predicted", exc)
        return 0.0, 0.0, 0.0
    reports = runs[OFFLOADING]
    assert schedule is not None
    per_step = float(np.median([r.dispatch_seconds for r in reports])) / len(schedule.steps)
    per_item = float(np.median([_gaps(r) for r in reports]))
    # the same ops without the copies: what the offloading steps take beyond them, after the enqueueing
    # and each item's own handling, is what the copies cost the compute stream
    plain = runs["layerwise"]
    extra = _streams_seconds(reports) - _streams_seconds(plain)
    extra -= per_item * (_compute_items(reports[0]) - _compute_items(plain[0]))
    copies = schedule.copies
    per_copy = max(0.0, extra) / copies if copies else 0.0
    _log.info(
        "dispatch probe: %.1f us per schedule step, %.1f us per stream item, %.1f us of compute per copy",
        per_step * 1e6,
        per_item * 1e6,
        per_copy * 1e6,
    )
    return per_step, per_item, per_copy


def _session(device: Device, policy: str) -> Any:
    """A session of the probe's network under ``policy`` on ``device``, as a Trainer makes one (no profile)."""
    from .. import policies
    from ..nn.loss import SoftmaxCrossEntropy
    from ..optim import SGD
    from .session import Session

    net = _network().init(seed=0)
    assert net.input_shape is not None
    return Session(
        net,
        device,
        policies.get(policy),
        SoftmaxCrossEntropy(),
        SGD(lr=0.01, momentum=0.9),
        input_shape=net.input_shape,
        dtype="float32",
        profiling=False,
        profile_cache=False,
        seed=0,
    )


def _streams_seconds(reports: list[Any]) -> float:
    """The median step's seconds after the host enqueued it (the streams' part)."""
    return float(np.median([r.seconds - r.dispatch_seconds for r in reports]))


def _compute_items(report: Any) -> int:
    return sum(1 for s in report.spans if s.stream == "compute")


def _gaps(report: Any) -> float:
    """The compute stream's mean time between one item's end and the next one's start."""
    spans = sorted((s for s in report.spans if s.stream == "compute"), key=lambda s: s.start)
    if len(spans) < 2:
        return 0.0
    return sum(max(0.0, b.start - a.end) for a, b in zip(spans, spans[1:])) / (len(spans) - 1)
