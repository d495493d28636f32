"""What a step reports: :class:`StepReport`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .timeline import Span, Timeline

__all__ = ["StepReport"]


@dataclass
class StepReport:
    """What one training step did and used. Bytes are the device pool's (with fragmentation)."""

    loss: float
    seconds: float
    peak_bytes: int
    average_bytes: float
    offloaded_bytes: int = 0
    stall_seconds: float = 0.0
    timeline: Timeline = field(default_factory=Timeline, repr=False)
    #: host threads the step's BLAS calls could use (the CPU device's core budget); None elsewhere
    threads: int | None = None
    #: the loss or a gradient was NaN or infinite: the step changed nothing (weights, optimizer state,
    #: batch-norm statistics)
    skipped: bool = False
    #: with ``check=True``: the first op (by name, with the pass) whose output was not finite, else None
    first_nonfinite: str | None = None
    #: the loss scale the step ran with (fp16 training), None where the loss was not scaled
    loss_scale: float | None = None
    #: seconds the host took to enqueue the step's schedule (on the CPU device its streams start after it)
    dispatch_seconds: float = 0.0
    #: encodings of data-dependent size (ssdc, zvc kept on the device) that came out larger than the block
    #: the plan sized at its density: (buffer, bytes needed, bytes planned); their values were kept in host
    #: memory for the step instead (slower, the same numbers, and no device memory beyond the plan's)
    spilled: tuple[tuple[str, int, int], ...] = ()
    #: "captured" (the step was recorded as a CUDA graph, then launched), "replayed" (one launch of the graph
    #: of an earlier step: its peak and average are that step's), "" (run as it is)
    graph: str = ""

    @property
    def spans(self) -> list[Span]:
        return self.timeline.spans

    def to_dict(self) -> dict[str, Any]:
        return {
            k: getattr(self, k)
            for k in (
                "loss",
                "seconds",
                "peak_bytes",
                "average_bytes",
                "offloaded_bytes",
                "stall_seconds",
                "threads",
                "skipped",
                "first_nonfinite",
                "loss_scale",
                "dispatch_seconds",
                "graph",
            )
        }
