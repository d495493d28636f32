"""The memory/time curve measured on a real device (``vmem plan --curve --measure``): each point's plan trained
for a few steps, its measured peak and step time beside the predicted.

The curve is planned from a Trainer's own profile of the device (every op, pass and algorithm, the host's
part of a step with it), and each point's Trainer plans with that same profile at the point's budget: the plan
it runs is the plan the curve shows (checked: a point whose plan comes out otherwise says so)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable

import numpy as np

from .. import nn
from ..planning.curve import Curve, curve

if TYPE_CHECKING:
    from ..costs.measured import Profiled
    from ..graph import Network

__all__ = ["measured_curve", "measure_points"]


def measured_curve(
    net: Network,
    batch: int,
    device: str = "cpu",
    *,
    precision: str = "fp32",
    points: int = 20,
    most: int = 40,
    steps: int = 5,
    seed: int = 0,
    profile_cache: bool = True,
    progress: Callable[[str], None] | None = None,
) -> Curve:
    """``net``'s curve at ``batch`` on ``device`` (a name: ``"cpu"``, ``"cuda:0"``), planned from a Trainer's
    profile there (``points`` and ``most`` as :func:`vmem.curve` takes them), then every point measured
    (:func:`measure_points`). ``profile_cache=False`` profiles afresh (not a profile kept from an earlier
    run: this machine as it is now). ``progress(text)`` hears of each stage."""
    from .trainer import Trainer

    say = progress or (lambda text: None)
    say(f"profiling {net.name} at batch {batch} on {device} ...")
    with Trainer(net, device=device, precision=precision, seed=seed, profile_cache=profile_cache) as trainer:
        costs = trainer.profile(batch)
        planning_device = trainer.device
        made = curve(
            net,
            batch,
            planning_device,
            precision=precision,
            points=points,
            most=most,
            costs=costs,
            progress=lambda done, total: say(f"planned {done} of {total} budgets"),
        )
    return measure_points(made, net, device, costs, steps=steps, seed=seed, progress=progress)


def measure_points(
    made: Curve,
    net: Network,
    device: str,
    costs: Profiled,
    *,
    steps: int = 5,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> Curve:
    """``made`` with each point's plan (auto's and the named policies') trained on ``device`` at its budget for
    ``steps`` timed steps after two warm-up steps, planned with ``costs`` (the curve's profile): each point's
    ``measured_peak`` (the most any step took) and ``measured_seconds`` (the median step)."""
    from .trainer import Trainer

    if steps < 1:
        raise ValueError(f"steps={steps!r}: measure at least one step")
    x, y = _batch(net, made.batch, seed)
    say = progress or (lambda text: None)
    done = []
    every = (*made.points, *made.named)
    for k, point in enumerate(every):
        say(f"measuring {k + 1} of {len(every)}: {point.policy} in {point.budget} bytes")
        with Trainer(
            net, device=device, memory=point.budget, policy=point.policy, precision=made.precision, seed=seed
        ) as trainer:
            trainer.session.costs[made.batch] = costs  # the curve's profile: the plan the curve shows
            for _ in range(2):
                trainer.step(x, y)
            reports = [trainer.step(x, y) for _ in range(steps)]
            plan = trainer.plans[made.batch]
        same = plan.peak_bytes == point.memory
        done.append(
            dataclasses.replace(
                point,
                measured_peak=max(r.peak_bytes for r in reports),
                measured_seconds=float(np.median([r.seconds for r in reports])),
                replanned=None if same else int(plan.peak_bytes),
            )
        )
    n = len(made.points)
    return dataclasses.replace(made, points=tuple(done[:n]), named=tuple(done[n:]))


def _batch(net: Network, batch: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A seeded batch for ``net``: token ids where an embedding reads its input, else normal values; labels
    over its classes."""
    if len(net.inputs) > 1:
        raise ValueError(f"{net.name}: measuring a curve feeds one input; this network takes {len(net.inputs)}")
    rng = np.random.default_rng(seed)
    shape = (batch, *net.input_shapes()[0])
    program = net.build(batch)
    readers = [op.layer for op in program.ops if program.input in op.inputs]
    table = next((r for r in readers if isinstance(r, nn.Embedding)), None)
    x = rng.integers(0, table.num, shape) if table is not None else rng.standard_normal(shape, np.float32)
    out = net.output_shape(batch)
    labels = rng.integers(0, out[-1], out[:-1] if len(out) > 2 else (batch,))
    return x, labels
