"""How busy the machine's other processes kept its cores while vmem measured: from ``/proc/stat`` (every core's
time since boot, the hypervisor's steal included) less this process's own CPU time, over an interval. A
timing's own check (its CPU time covered its wall time: :func:`vmem.benchmarks.typical_seconds`) passes an op of
two threads while another process holds a core: its threads share one core and still run all the time. The
whole machine's count tells it (Linux only; elsewhere nothing is known and nothing is said)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

__all__ = ["Sample", "sample", "busy_elsewhere", "DISTURBED", "SHORTEST"]

#: cores other processes (and the hypervisor's steal) kept busy on average, from which a measurement is
#: called disturbed
DISTURBED = 0.25
#: the shortest interval the count tells (the kernel counts in ticks of 10 ms: ten of them)
SHORTEST = 0.1


@dataclass(frozen=True)
class Sample:
    """At ``at`` (perf_counter seconds): every core's busy seconds since boot (steal included) and this
    process's CPU seconds."""

    at: float
    busy: float
    own: float


def _busy_seconds(path: str = "/proc/stat") -> float | None:
    """Every core's non-idle time since boot in seconds (user, nice, system, irq, softirq, steal), or None
    where the file cannot be read."""
    try:
        with open(path, "rb") as f:
            first = f.readline().split()
    except OSError:
        return None
    if not first or first[0] != b"cpu" or len(first) < 8:
        return None
    try:
        user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in first[1:8])
        steal = int(first[8]) if len(first) > 8 else 0
    except ValueError:
        return None
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def sample(path: str = "/proc/stat") -> Sample | None:
    """The machine's count now, or None where it cannot be read (not Linux)."""
    busy = _busy_seconds(path)
    if busy is None:
        return None
    return Sample(time.perf_counter(), busy, time.process_time())


def busy_elsewhere(before: Sample | None, after: Sample | None) -> float | None:
    """The cores other processes kept busy on average between two samples (never below 0), or None where
    either is unknown or they are too close together to tell (the kernel counts in ticks of 10 ms)."""
    if before is None or after is None or after.at - before.at < SHORTEST / 2:
        return None
    others = (after.busy - before.busy) - (after.own - before.own)
    return max(0.0, others / (after.at - before.at))
