"""A training step run as micro-batches (:mod:`vmem.planning.microbatch` plans them): :class:`MicroBatched`."""

from __future__ import annotations

import copy
import dataclasses
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from .._typing import Array
from .report import StepReport
from .timeline import Timeline

if TYPE_CHECKING:
    from .executor import Executor

__all__ = ["MicroBatched", "Sums"]


class _Stop(Exception):
    """A statistics pass's micro-batch has given its share of the sum being made: it stops there."""


class Sums:
    """Batch norm's whole-batch sums for a step run as micro-batches: what each micro-batch's executor is
    given as its ``batch_group`` (the channel a synchronized batch norm sums over). A batch norm asks for
    three sums (its input's, the squares of its centred input, and backward's pair) and each depends on
    those before it; the step finds them one at a time. In each statistics pass every micro-batch runs until
    the first sum not yet known (:meth:`allreduce` adds its share and stops it); once every sum is known, the
    pass is the step itself: each sum is answered with the whole batch's, so each micro-batch normalizes as
    the whole batch does, and batch norm's backward uses the whole batch's sums."""

    def __init__(self) -> None:
        self.known: list[Array] = []
        self.pending: Array | None = None
        self.calls = 0

    def begin(self) -> None:
        """A micro-batch's run begins: its sums are asked for from the first."""
        self.calls = 0

    def allreduce(self, array: Array) -> None:
        i, self.calls = self.calls, self.calls + 1
        if i < len(self.known):
            array[...] = self.known[i]
            return
        if self.pending is None:
            self.pending = array.copy()
        else:
            self.pending += array
        raise _Stop

    def end_pass(self) -> None:
        """A statistics pass has run: the sum it made is known."""
        self.known.append(self.pending)
        self.pending = None


class MicroBatched:
    """One training step of ``sum(sizes)`` samples as micro-batches of ``sizes``, in order, each run by its
    executor (``executors[i]``: the first writes the weight gradients, later ones add to them, the last
    updates the weights; one executor may run several). Each micro-batch's loss gradient is weighed by its
    share of the step's samples (of its labels that count, where the loss ignores some), so that the
    gradients sum to the whole batch's. Runs as :meth:`Executor.run` does and reports the step as one:
    its loss the shares' weighed sum, its time and bytes moved the sums, its peak the largest.

    With batch norm (``sums``: the :class:`Sums` its executors were made with), statistics passes come
    first, one for each sum the step needs (:class:`Sums`); each micro-batch draws its random numbers
    (dropout's masks) from its own generator, the same in every pass, and batch norm's running statistics
    are updated once, by the first micro-batch of the step (the whole batch's mean and variance)."""

    def __init__(self, sizes: Sequence[int], executors: Sequence[Executor], sums: Sums | None = None):
        if len(sizes) != len(executors) or len(sizes) < 2:
            raise ValueError(f"micro-batches: {len(sizes)} sizes for {len(executors)} executors (two or more)")
        self.sizes, self.executors = tuple(sizes), tuple(executors)
        self.batch = sum(self.sizes)
        self.sums = sums
        #: the last micro-batch's schedule (the one that updates), for what reads a step's schedule
        self.schedule = self.executors[-1].schedule

    def _counts(self, labels: np.ndarray) -> list[int]:
        """Per micro-batch, the labels its loss averages over."""
        ignore = getattr(self.executors[0].loss, "ignore", None)
        out, start = [], 0
        for size in self.sizes:
            part = labels[start : start + size]
            out.append(int(part.size if ignore is None else np.count_nonzero(part != ignore)))
            start += size
        return out

    def run(
        self,
        x: np.ndarray | Sequence[np.ndarray],
        labels: np.ndarray | None,
        *,
        train: bool,
        rng: np.random.Generator,
        step: int = 0,
        check: bool = False,
        loss_scale: float | None = None,
    ) -> tuple[StepReport, None]:
        if not train or labels is None:
            raise ValueError("micro-batches run a training step (labels given, train=True)")
        several = isinstance(x, (tuple, list))
        arrays: list[np.ndarray] = [np.asarray(a) for a in x] if several else [np.asarray(x)]
        if any(len(a) != self.batch for a in arrays) or len(labels) != self.batch:
            raise ValueError(f"micro-batches of {self.sizes} take a batch of {self.batch} samples")
        counts = self._counts(np.asarray(labels))
        total = max(sum(counts), 1)
        bounds = np.cumsum((0,) + self.sizes)

        # every micro-batch's input as its step uploads it, made before the first runs: the host's transposes
        # and casts would otherwise hold the device idle between micro-batches
        parts = []
        for i, ex in enumerate(self.executors):
            part = [a[bounds[i] : bounds[i + 1]] for a in arrays]
            parts.append(ex.host_batch(part if several else part[0]))

        def one(i: int, generator: np.random.Generator) -> StepReport:
            lo, hi = bounds[i], bounds[i + 1]
            report, _ = self.executors[i].run(
                parts[i],
                labels[lo:hi],
                train=True,
                rng=generator,
                step=step,
                check=check,
                loss_scale=loss_scale,
                share=counts[i] / total,
            )
            return report

        if self.sums is None:
            reports = [one(i, rng) for i in range(len(self.sizes))]
            return _combined(reports, [c / total for c in counts]), None
        started = time.perf_counter()
        reports = self._with_sums(one, rng)
        report = _combined(reports, [c / total for c in counts])
        # the step's time counts its statistics passes (its timeline holds the step's own micro-batches)
        return dataclasses.replace(report, seconds=time.perf_counter() - started), None

    def _with_sums(
        self, one: Callable[[int, np.random.Generator], StepReport], rng: np.random.Generator
    ) -> list[StepReport]:
        """The step with batch norm: statistics passes until every sum is known, then the step (whose first
        micro-batch alone keeps its update of the running statistics)."""
        sums = self.sums
        assert sums is not None
        # drawn from the step's generator (so a resumed run draws as the uninterrupted one did)
        generators = [np.random.default_rng(int(s)) for s in rng.integers(0, 2**63, size=len(self.sizes))]
        stats = self.executors[0].running_stats
        before = _kept(self.executors[0].xp, stats)
        sums.known, sums.pending = [], None
        while True:
            stopped = []
            for i in range(len(self.sizes)):
                sums.begin()
                try:
                    report = one(i, copy.deepcopy(generators[i]))
                except _Stop:
                    stopped.append(i)
                    _put(stats, before)
                    continue
                if stopped:  # every micro-batch asks for the same sums in the same order
                    raise RuntimeError(f"micro-batch {i} needed no sum that micro-batch 0 did")
                return [report, *self._rest(one, generators, stats, before)]
            sums.end_pass()

    def _rest(
        self, one: Callable[[int, np.random.Generator], StepReport], generators: list, stats: list, before: list
    ) -> list[StepReport]:
        """The step's micro-batches after the first, once every sum is known: the running statistics stay
        as the first left them (the whole batch's update), or as before the step where it is skipped."""
        updated = _kept(self.executors[0].xp, stats)
        reports = []
        for i in range(1, len(self.sizes)):
            self.sums.begin()  # type: ignore[union-attr]
            try:
                reports.append(one(i, copy.deepcopy(generators[i])))
            except _Stop:
                raise RuntimeError(f"micro-batch {i} needed a sum that micro-batch 0 did not") from None
            _put(stats, updated)
        if reports[-1].skipped:
            _put(stats, before)
        return reports


def _kept(xp: Any, views: list[Array]) -> list[Array]:
    """Copies of ``views`` (batch norm's running statistics, kept aside)."""
    return [xp.array(v) for v in views]


def _put(views: list[Array], values: list[Array]) -> None:
    for view, value in zip(views, values):
        view[...] = value


def _combined(reports: list[StepReport], shares: list[float]) -> StepReport:
    """The step's report from its micro-batches' (its timeline: the spans of each, one after the other, on
    the clock they were measured on, from the first one's start)."""
    seconds = sum(r.seconds for r in reports)
    timeline = Timeline(origin=reports[0].timeline.origin)
    for r in reports:
        timeline.spans.extend(r.timeline.spans)
        timeline.samples.extend(r.timeline.samples)
    timeline.marks.update(reports[-1].timeline.marks)
    timeline.math = reports[-1].timeline.math
    last = reports[-1]
    return StepReport(
        loss=float(sum(s * r.loss for s, r in zip(shares, reports))),
        seconds=seconds,
        peak_bytes=max(r.peak_bytes for r in reports),
        average_bytes=sum(r.average_bytes * r.seconds for r in reports) / seconds if seconds else last.average_bytes,
        offloaded_bytes=sum(r.offloaded_bytes for r in reports),
        stall_seconds=sum(r.stall_seconds for r in reports),
        timeline=timeline,
        threads=last.threads,
        skipped=last.skipped,
        first_nonfinite=next((r.first_nonfinite for r in reports if r.first_nonfinite), None),
        loss_scale=last.loss_scale,
        dispatch_seconds=sum(r.dispatch_seconds for r in reports),
        spilled=tuple(s for r in reports for s in r.spilled),
        graph="replayed"
        if all(r.graph == "replayed" for r in reports)
        else next((r.graph for r in reports if r.graph), ""),
    )
