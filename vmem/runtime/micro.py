"""A training step run as micro-batches (:mod:`vmem.planning.microbatch` plans them): :class:`MicroBatched`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from .report import StepReport
from .timeline import Timeline

if TYPE_CHECKING:
    from .executor import Executor

__all__ = ["MicroBatched"]


class MicroBatched:
    """One training step of ``sum(sizes)`` samples as micro-batches of ``sizes``, in order, each run by its
    executor (``executors[i]``: the first writes the weight gradients, later ones add to them, the last
    updates the weights; one executor may run several). Each micro-batch's loss gradient is weighed by its
    share of the step's samples (of its labels that count, where the loss ignores some), so that the
    gradients sum to the whole batch's. Runs as :meth:`Executor.run` does and reports the step as one:
    its loss the shares' weighed sum, its time and bytes moved the sums, its peak the largest."""

    def __init__(self, sizes: Sequence[int], executors: Sequence[Executor]):
        if len(sizes) != len(executors) or len(sizes) < 2:
            raise ValueError(f"micro-batches: {len(sizes)} sizes for {len(executors)} executors (two or more)")
        self.sizes, self.executors = tuple(sizes), tuple(executors)
        self.batch = sum(self.sizes)
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
        reports: list[StepReport] = []
        start = 0
        for size, count, ex in zip(self.sizes, counts, self.executors):
            part = [a[start : start + size] for a in arrays]
            report, _ = ex.run(
                part if several else part[0],
                labels[start : start + size],
                train=True,
                rng=rng,
                step=step,
                check=check,
                loss_scale=loss_scale,
                share=count / total,
            )
            reports.append(report)
            start += size
        return _combined(reports, [c / total for c in counts]), None


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
    )
