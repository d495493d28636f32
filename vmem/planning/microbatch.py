"""Micro-batches: a training step that fits under none of a policy's plans, run as slices of its batch.

Where every layer treats each sample on its own (convolutions, activations, pooling, linear layers, sums),
a step over ``batch`` samples is the sum of steps over slices of them, each one's loss gradient weighed by
its share of the samples. Batch norm keeps the whole batch's statistics: its samples meet only in sums over
the batch (the forward's mean and variance, the backward's two sums), which statistics passes over the
micro-batches find before the step, one sum at a time (:func:`sums_passes` prices them; the runtime's
:class:`vmem.runtime.micro.Sums` makes them); the step then normalizes each micro-batch with the whole
batch's statistics. The step then runs as ``k`` micro-batches one after the
other: the first writes the weight gradients, each later one adds to them (each gradient made in a
temporary, as a shared parameter's), and the last runs the optimizer. The device holds one micro-batch's
feature maps at a time (and the policy's plan decides for that micro-batch, offloads included), so the
batch is bounded by host memory and time rather than by a layer's working set.

The planner (:func:`plan_microbatched`) takes the largest micro-batch at which every micro-batch of the
step fits (bisection: fewer micro-batches are faster), plans each size under the policy, and replays the
three kinds of micro-batch the step runs (the first, the middle ones, the last) for its figures: the peak
is the largest of theirs, the step time the sum of every micro-batch's, the optimizer counted once.
Results equal the whole batch's within float rounding (the gradients are summed in a fixed order, the
micro-batches' in turn); dropout draws its masks per micro-batch (the same distribution, other draws).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ..errors import PlanError
from ..graph import Program
from ..schedule import Schedule
from .plan import plan_program
from .result import PlanResult, evaluate
from .target import Target

if TYPE_CHECKING:
    from ..costs.model import CostModel
    from ..policies.base import Policy

__all__ = [
    "PER_SAMPLE",
    "SUMMED",
    "per_sample",
    "splittable",
    "sums_passes",
    "slice_sizes",
    "MicroPlan",
    "Part",
    "plan_microbatched",
    "microbatches",
]

#: Layer kinds that compute each sample on its own (a micro-batch's results are the batch's rows)
PER_SAMPLE = frozenset(
    {
        "conv",
        "relu",
        "maxpool",
        "avgpool",
        "linear",
        "flatten",
        "add",
        "sub",
        "mul",
        "div",
        "concat",
        "tokens",
        "pad",
        "identity",
        "dropout",
        "gelu",
        "sigmoid",
        "tanh",
        "hardsigmoid",
        "hardswish",
        "silu",
        "clip",
        "erf",
        # over axes after the batch axis (vmem's layers refuse the batch axis by name)
        "constop",
        "embedding",
        "layernorm",
        "lrn",
        "matmul",
        "mean",
        "reshape",
        "softmax",
        "split",
        "take",
        "transpose",
        "lengthmask",
        "select",
        "expand",
    }
)


#: Layer kinds whose samples meet only in sums over the batch (batch norm's statistics and its backward's
#: two sums): micro-batches find the whole batch's sums in statistics passes first (:class:`vmem.runtime.micro.Sums`)
SUMMED = frozenset({"batchnorm"})


def per_sample(program: Program) -> bool:
    """Whether every op of ``program`` computes each sample on its own."""
    return all(op.kind in PER_SAMPLE for op in program.ops)


def splittable(program: Program) -> bool:
    """Whether ``program`` can run as micro-batches: every op per sample (:data:`PER_SAMPLE`) or meeting the
    others only in sums over the batch (:data:`SUMMED`)."""
    return all(op.kind in PER_SAMPLE or op.kind in SUMMED for op in program.ops)


def sums_passes(program: Program) -> tuple[float, ...]:
    """The statistics passes a micro-batched step of ``program`` runs before the step, one for each whole-
    batch sum (each batch norm's two in the forward, one in the backward where its input has a gradient),
    each as the share of a step it runs (the forward up to the batch norm, or the whole forward and the
    backward down to it; counted in floating-point operations, a backward as twice its forward)."""
    ops = program.ops
    forward = [float(op.flops) for op in ops]
    whole = 3.0 * (sum(forward) or 1.0)
    out: list[float] = []
    for op in ops:
        if op.kind in SUMMED:
            upto = sum(forward[: op.index + 1])
            out += [upto / whole, upto / whole]
            if program.tensors[op.inputs[0]].needs_grad:
                out.append((sum(forward) + 2.0 * sum(forward[op.index :])) / whole)
    return tuple(out)


def microbatches(policy: "Policy | str") -> bool:
    """Whether ``policy`` lets a step that does not fit run as micro-batches (its ``microbatch`` option)."""
    from .. import policies

    return policies.get(policy).microbatch == "on"


def slice_sizes(batch: int, size: int) -> tuple[int, ...]:
    """The micro-batches of a step of ``batch`` samples at most ``size`` each, in order: equal ones, then
    the rest."""
    if not 1 <= size <= batch:
        raise ValueError(f"micro-batch size {size} for a batch of {batch}")
    whole, rest = divmod(batch, size)
    return (size,) * whole + ((rest,) if rest else ())


@dataclass(frozen=True)
class Part:
    """One kind of micro-batch a step runs: its ``size``, how many of it (``count``), whether it adds its
    weight gradients to the earlier ones' (``accumulate``) and runs the optimizer (``update``), its
    ``program`` and its placed ``schedule``, and its plan's figures (``result``)."""

    size: int
    count: int
    accumulate: bool
    update: bool
    program: Program
    schedule: Schedule
    result: PlanResult


@dataclass(frozen=True)
class MicroPlan:
    """A step of ``batch`` samples as micro-batches of ``sizes`` (in order): the kinds of micro-batch it
    runs (``parts``: the first, the middle ones, the last) and the step's figures (``result``)."""

    batch: int
    sizes: tuple[int, ...]
    parts: tuple[Part, ...]
    result: PlanResult
    #: the statistics passes run before each step (batch norm's whole-batch sums), as shares of a step
    passes: tuple[float, ...] = ()

    def part_of(self, index: int) -> Part:
        """The kind of micro-batch ``index`` (0-based) is."""
        last = len(self.sizes) - 1
        kinds = {(p.accumulate, p.update): p for p in self.parts}
        if index == 0:
            return kinds[(False, last == 0)]
        return kinds[(True, index == last)]


def _combined(batch: int, sizes: tuple[int, ...], parts: list[Part], passes: tuple[float, ...] = ()) -> PlanResult:
    """The step's figures from its micro-batches': the largest peak (and per category), the sums of time
    and offloaded bytes, the time-weighted average; the statistics ``passes`` add their shares of the
    micro-batches' time (they stop early: their peak is within the step's)."""
    figures = [p.result.figures for p in parts]
    timed = all(f.step_seconds is not None for f in figures)
    weights = [p.count * (f.step_seconds if timed else 1.0) for p, f in zip(parts, figures)]  # type: ignore[operator]
    total = sum(weights) or 1.0

    def summed(name: str) -> float | None:
        values = [getattr(f, name) for f in figures]
        return (
            None
            if any(v is None for v in values)
            else sum(p.count * v for p, v in zip(parts, values)) * (1.0 + sum(passes))
        )

    categories = {
        c: {
            "peak": max(f.by_category.get(c, {}).get("peak", 0) for f in figures),
            "average": sum(w * f.by_category.get(c, {}).get("average", 0.0) for w, f in zip(weights, figures)) / total,
        }
        for c in dict.fromkeys(c for f in figures for c in f.by_category)
    }
    peak_part = max(parts, key=lambda p: p.result.peak_bytes)
    middle = next((p for p in parts if p.accumulate and not p.update), parts[-1])
    combined = dataclasses.replace(
        middle.result.figures,
        peak_bytes=peak_part.result.peak_bytes,
        peak_at=peak_part.result.figures.peak_at,
        layer_peaks=peak_part.result.figures.layer_peaks,
        average_bytes=sum(w * f.average_bytes for w, f in zip(weights, figures)) / total,
        by_category=categories,
        offloaded_bytes=int(sum(p.count * f.offloaded_bytes for p, f in zip(parts, figures))),
        fits=all(f.fits for f in figures),
        step_seconds=summed("step_seconds"),
        stall_seconds=summed("stall_seconds"),
        update_seconds=next((f.update_seconds for p, f in zip(parts, figures) if p.update), None),
        baseline_step_seconds=None,
    )
    plan = dataclasses.replace(middle.result.plan, batch=batch, microbatch=len(sizes))
    step = combined.step_seconds
    plan = dataclasses.replace(
        plan,
        reason=f"{plan.reason.rstrip('.')} (each micro-batch); as {len(sizes)} micro-batches of {sizes[0]} (of "
        f"{batch}), one after the other"
        + (f", after {len(passes)} statistics passes for batch norm's whole-batch sums" if passes else "")
        + (f": the whole step {step * 1e3:.2f} ms predicted." if step is not None else "."),
    )
    return PlanResult(plan, combined)


def _attempt(
    build: Callable[[int], Program],
    batch: int,
    size: int,
    target: Target,
    policy: "Policy | str",
    optimizer_slots: tuple[str, ...],
    costs: Callable[[int], "CostModel | None"],
) -> MicroPlan | None:
    """The step as micro-batches of at most ``size``, each kind planned and replayed; None where one does
    not fit (or the policy refuses one)."""
    sizes = slice_sizes(batch, size)
    last = len(sizes) - 1
    kinds: dict[tuple[int, bool, bool], int] = {}  # (size, accumulate, update) -> count
    for i, s in enumerate(sizes):
        key = (s, i > 0, i == last)
        kinds[key] = kinds.get(key, 0) + 1
    programs: dict[int, Program] = {}
    decided: dict[int, PlanResult] = {}
    parts = []
    for (s, accumulate, update), count in kinds.items():
        if s not in decided:  # the policy decides once a size, for a micro-batch that adds (the leanest)
            try:
                result, placed = plan_program(
                    build(s), target, policy, optimizer_slots=optimizer_slots, costs=costs(s), accumulate=True
                )
            except PlanError:
                return None
            if not result.fits:
                return None
            decided[s], programs[s] = result, placed.program  # the program as the device sees it
        result, schedule = evaluate(
            programs[s],
            target.spec,
            decided[s].plan,
            alignment=target.alignment,
            optimizer_slots=optimizer_slots,
            costs=target.costs(costs(s)),
            accumulate=accumulate,
            update=update,
        )
        if not result.fits:
            return None
        parts.append(Part(s, count, accumulate, update, programs[s], schedule, result))
    passes = sums_passes(programs[sizes[0]])
    return MicroPlan(batch, sizes, tuple(parts), _combined(batch, sizes, parts, passes), passes)


def plan_microbatched(
    build: Callable[[int], Program],
    batch: int,
    target: Target,
    policy: "Policy | str",
    *,
    optimizer_slots: tuple[str, ...] = ("momentum",),
    costs: "CostModel | None" = None,
) -> MicroPlan | None:
    """A step of ``batch`` samples as the fewest micro-batches that fit ``target`` under ``policy``
    (``build(n)``: the program at ``n`` samples; ``costs``: the whole batch's measured cost model, read
    for each micro-batch by :class:`vmem.costs.AtBatch`; without one, the target's), or None where the
    policy does not run micro-batches (:func:`microbatches`), the network cannot be split
    (:func:`splittable`) or not even micro-batches of one sample fit. Bisects the micro-batch size (a size
    that fits is taken to mean every smaller one does), then tries as many micro-batches of equal sizes,
    kept where faster."""
    if batch < 2 or not microbatches(policy) or not splittable(build(1)):
        return None
    from ..costs import AtBatch

    def costs_of(n: int) -> "CostModel | None":
        return None if costs is None else AtBatch(costs, n / batch)

    best = _attempt(build, batch, 1, target, policy, optimizer_slots, costs_of)
    if best is None:
        return None
    lo, hi = 1, batch  # fits at lo; the whole batch is taken not to (the caller tried it)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        found = _attempt(build, batch, mid, target, policy, optimizer_slots, costs_of)
        if found is not None:
            lo, best = mid, found
        else:
            hi = mid
    even = -(-batch // len(best.sizes))  # as many micro-batches, as equal as they come: each leaner, so the
    if even < lo:  # policy may fit it with faster choices (the largest size may have needed its last resort)
        found = _attempt(build, batch, even, target, policy, optimizer_slots, costs_of)
        if found is not None and _faster(found, best):
            best = found
    return best


def _faster(a: MicroPlan, b: MicroPlan) -> bool:
    """Whether ``a``'s step is predicted faster than ``b``'s (where neither is timed: no)."""
    ta, tb = a.result.step_seconds, b.result.step_seconds
    return ta is not None and tb is not None and ta < tb
