"""The timeline of a step: op spans per stream and device memory per category over time.

Spans are recorded on the streams themselves (each op stamps its start and end when the stream runs
it); memory is sampled at every compute op boundary (the pool's usage when the op was enqueued, which in
stream order is the usage while it runs). A timeline exports to the Chrome trace format (open it in
Perfetto or chrome://tracing) and plots memory over time (matplotlib, optional).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, TYPE_CHECKING

from .._files import write_output

if TYPE_CHECKING:
    from ..streams.base import Event

__all__ = ["Span", "Timeline"]


@dataclass
class Span:
    """One piece of work on a stream. ``kind``: compute, offload, prefetch or wait (a stall)."""

    name: str
    stream: str
    kind: str
    start: float
    end: float
    in_use: int = 0
    usage: dict[str, int] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class Timeline:
    spans: list[Span] = field(default_factory=list)
    origin: float = 0.0
    #: (time, readings) of the device itself (NVML on a GPU: memory the driver sees used, PCIe throughput),
    #: taken when the step starts and when it ends
    samples: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    #: facts of the step as a whole, written into the trace at its end: under fp16, ``loss_scale`` and
    #: ``skipped`` (the gradients overflowed: nothing was updated)
    marks: dict[str, Any] = field(default_factory=dict)
    #: how the device computed FP32 convolutions ("tf32" or "exact"; ``DeviceSpec.math``), in the trace's
    #: metadata (``otherData``)
    math: str | None = None

    #: spans timed by events (an asynchronous device), read by :meth:`resolve` once their work has run
    waiting: list[tuple] = field(default_factory=list, repr=False)
    started: Any = field(default=None, repr=False)  # the timing event ``origin`` stands for

    def record(self, span: Span) -> None:
        self.spans.append(span)  # list.append is atomic: streams record from their own threads

    def start(self, event: Event) -> None:
        """Events measure the spans of this step from ``event``, recorded when the step began."""
        self.started = event

    def pending(self, name: str, stream: str, kind: str, usage: dict[str, int], start: Any, end: Any) -> None:
        """A span whose start and end are timing events, to read once they have completed."""
        self.waiting.append((name, stream, kind, dict(usage), start, end))

    def resolve(self) -> None:
        """Turn the event-timed spans into spans (after the step's work has completed): each event's time
        from the step's first event, on the host's clock from ``origin``."""
        for name, stream, kind, usage, start, end in self.waiting:
            self.record(
                Span(
                    name,
                    stream,
                    kind,
                    self.origin + self.started.elapsed_time(start),
                    self.origin + self.started.elapsed_time(end),
                    sum(usage.values()),
                    usage,
                )
            )
        self.waiting.clear()

    def sample(self, time: float, readings: dict[str, Any]) -> None:
        if readings:
            self.samples.append((time, dict(readings)))

    def by_stream(self, stream: str) -> list[Span]:
        return sorted((s for s in self.spans if s.stream == stream), key=lambda s: s.start)

    @property
    def stall_seconds(self) -> float:
        """Time the compute stream spent waiting for the memory stream."""
        return sum(s.seconds for s in self.spans if s.kind == "wait" and s.stream == "compute")

    def average_bytes(self, fallback: float) -> float:
        """Device memory in use, weighted by the time each compute-stream span took."""
        spans = [s for s in self.spans if s.stream == "compute"]
        busy = sum(s.seconds for s in spans)
        return sum(s.in_use * s.seconds for s in spans) / busy if busy > 0 else float(fallback)

    def memory(self) -> list[tuple[float, dict[str, int]]]:
        """(seconds since the step began, bytes per category) at every compute op boundary."""
        out = []
        for s in self.by_stream("compute"):
            out.append((s.start - self.origin, dict(s.usage)))
            out.append((s.end - self.origin, dict(s.usage)))
        return out

    # -- export ------------------------------------------------------------------------------------
    def chrome_trace(self) -> dict[str, Any]:
        """The timeline as a Chrome trace (JSON object format): one thread per stream, memory counters."""
        tids = {"compute": 1, "memory": 2}
        events: list[dict[str, Any]] = [
            {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "vmem device"}},
        ]
        for stream, tid in tids.items():
            events.append(
                {"ph": "M", "name": "thread_name", "pid": 1, "tid": tid, "args": {"name": f"{stream} stream"}}
            )
        for s in sorted(self.spans, key=lambda s: s.start):
            events.append(
                {
                    "ph": "X",
                    "name": s.name,
                    "cat": s.kind,
                    "pid": 1,
                    "tid": tids.get(s.stream, 3),
                    "ts": (s.start - self.origin) * 1e6,
                    "dur": max(s.seconds, 0.0) * 1e6,
                }
            )
        for t, readings in self.samples:
            counters = {
                k: v / 2**20 if k.endswith("_bytes") else v for k, v in readings.items() if isinstance(v, (int, float))
            }
            events.append(
                {"ph": "C", "name": "device readings", "pid": 1, "ts": (t - self.origin) * 1e6, "args": counters}
            )
        if self.marks:
            end = max((s.end for s in self.spans), default=self.origin)
            label = ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in self.marks.items())
            ts = (end - self.origin) * 1e6
            events.append({"ph": "i", "s": "p", "name": f"step: {label}", "pid": 1, "ts": ts, "args": dict(self.marks)})
        for t, usage in self.memory()[::2]:
            events.append(
                {
                    "ph": "C",
                    "name": "device memory (MiB)",
                    "pid": 1,
                    "ts": t * 1e6,
                    "args": {k: v / 2**20 for k, v in usage.items()},
                }
            )
        trace: dict[str, Any] = {"traceEvents": events, "displayTimeUnit": "ms"}
        if self.math is not None:
            trace["otherData"] = {"math": self.math}
        return trace

    def write_chrome_trace(self, path: str | os.PathLike) -> None:
        """The step as a Chrome trace (chrome://tracing, Perfetto) at ``path``: a regular file, replaced whole
        (never written through a link or into a FIFO: :func:`vmem._files.write_output`)."""
        trace = self.chrome_trace()
        write_output(path, lambda f: json.dump(trace, f), "a trace")

    def plot(self, path: str | os.PathLike, title: str = "") -> None:
        """Device memory per category over the step, stacked, as a PNG (needs matplotlib); the copies as bars
        along the time axis (offloads red, prefetches green), named in the legend."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError("plotting needs matplotlib: pip install 'vmem[plot]'") from exc
        samples = self.memory()
        cats = sorted({k for _, u in samples for k in u})
        times = [t * 1e3 for t, _ in samples]
        fig, ax = plt.subplots(figsize=(9, 4.5))
        ax.stackplot(times, [[u.get(c, 0) / 2**20 for _, u in samples] for c in cats], labels=cats, step="post")
        labels = {  # each kind of copy named once in the legend
            "offload": "offload: a copy to pinned host memory (memory stream)",
            "prefetch": "prefetch: a copy back to the device (memory stream)",
        }
        for s in self.spans:
            if s.kind in ("offload", "prefetch"):
                ax.axvspan(
                    (s.start - self.origin) * 1e3,
                    (s.end - self.origin) * 1e3,
                    ymin=0,
                    ymax=0.03,
                    color="tab:red" if s.kind == "offload" else "tab:green",
                    alpha=0.6,
                    lw=0,
                    label=labels.pop(s.kind, None),
                )
        ax.set_xlabel("time in step (ms)")
        ax.set_ylabel("device memory (MiB)")
        ax.set_title(title or "device memory over one step (red: offload, green: prefetch)")
        ax.legend(loc="upper right", fontsize=8)
        fig.tight_layout()
        try:
            write_output(path, lambda f: fig.savefig(f, dpi=110, format="png"), "a plot", binary=True)
        finally:
            plt.close(fig)
