"""What a run holds throughout (its persistent buffers) and the evaluation passes planned beside it."""

from __future__ import annotations

import dataclasses
from typing import Any

from .. import policies
from ..graph import Program
from ..policies.plan import Plan
from ..schedule.collectives import owners, sharded_buffers
from ..schedule.lower import lower_inference, persistent_buffers
from ..schedule.pack import place
from .result import replay_fitting
from .target import Target

__all__ = ["inference_plan", "persistent"]


def inference_plan(program: Program, target: Target, persistent: list[Any], trained: Plan | None) -> tuple[Any, int]:
    """An evaluation pass of ``program`` (at its batch) planned beside the training state (``persistent``:
    weights, gradients, optimizer state at the bottom of the arena, as they are during the run) and packed
    offline: (its schedule, its peak), or (None, the least peak it needs) where it does not fit ``target``.
    Its convolutions run the ``trained`` plan's forward algorithms where they are offered, else those with
    the least workspace."""
    program = target.view(program)
    spec, alignment = target.spec, target.alignment
    lean = policies.get("baseline:algos=memory").decide(program, spec)
    candidates = []
    if trained is not None:
        offered = {op.name: op.algorithms.get("forward", []) for op in program.ops}
        algos = {
            name: {**passes, "forward": trained.algos[name]["forward"]}
            for name, passes in lean.algos.items()
            if trained.algos.get(name, {}).get("forward") in offered.get(name, [])
        }
        candidates.append(dataclasses.replace(lean, algos={**lean.algos, **algos}))
    candidates.append(lean)
    needs = []
    for decided in candidates:
        schedule = place(dataclasses.replace(lower_inference(program, decided, alignment), persistent=persistent))
        figures = replay_fitting(schedule, spec, alignment)
        if figures.fits:
            return schedule, figures.peak_bytes
        needs.append(figures.peak_bytes)
    return None, min(needs)


def persistent(program: Program, optimizer_slots: tuple[str, ...], shard: tuple[int, int] | None = None) -> list[Any]:
    """The buffers a run holds throughout: weights, gradients and the optimizer's state (with ``shard``, (the
    number of ranks, this rank), only this rank's share of the state: ZeRO's stage 1)."""
    buffers = persistent_buffers(program, optimizer_slots)
    if shard is not None:
        size, rank = shard
        buffers = sharded_buffers(buffers, owners(program, size), rank)
    return buffers
