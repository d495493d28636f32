"""Helper threads vmem starts besides the stream workers (the codec kernels' workers, the link thread
of transfers through a codec, the CPU layers' second lane), and the core budget that all of vmem's busy
threads share.

Each is a :class:`WorkerPool`, made on first use. Devices hold them: every device calls :func:`hold`
when it is made and :func:`release` when it is closed, and when the last device closes every pool is
shut down and its threads joined, so that no thread vmem started outlives ``close()``. A pool used
again afterwards (a codec called on its own) starts anew; :func:`shutdown` stops them all at any time.

:data:`BUDGET` is the number of threads a step may keep busy: the cores this process may run on, less
the cores other processes kept busy lately. The CPU device runs each step under :meth:`CoreBudget.limit`,
which caps BLAS's threads to it (through threadpoolctl; on two cores BLAS runs single-threaded and
the layers run two lanes of work side by side instead, see :mod:`vmem.nn.lanes`), and the codec
kernels split their grids over
no more workers than it allows, so that a step never runs more busy threads than there are free cores
and slows gracefully, not by spinning threads against each other, when another process competes.
"""

from __future__ import annotations

import contextlib
import os
import warnings
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterable, Iterator

__all__ = [
    "WorkerPool",
    "KERNELS",
    "LINK",
    "LANE",
    "LANES",
    "hold",
    "release",
    "shutdown",
    "PREFIX",
    "cores",
    "CoreBudget",
    "BUDGET",
]

#: Name prefix of every helper thread vmem starts (stream workers are ``vmem-stream-...``).
PREFIX = "vmem-"
#: Lanes the CPU layers deal their work to (:mod:`vmem.nn.lanes`, run by :mod:`vmem.device.lanes`); they run side by side on this many cores.
LANES = 2


def _affinity() -> set[int] | None:
    """The CPUs this process may run on (None where the system does not say)."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return None


def cores() -> int:
    """Cores this process may run on."""
    cpus = _affinity()
    return len(cpus) if cpus else os.cpu_count() or 1


def _busy_seconds(cpus: set[int] | None) -> float | None:
    """CPU seconds the machine's ``cpus`` have run processes since boot (from /proc/stat), None where unknown."""
    try:
        with open("/proc/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    ticks = _busy_ticks(text, cpus)
    return None if ticks is None else ticks / hz


def _busy_ticks(stat: str, cpus: set[int] | None) -> int | None:
    """Ticks the per-CPU lines of ``stat`` (/proc/stat's text) spent running this machine's processes: user,
    nice, system, irq and softirq. Not idle or iowait, and not steal: the time a virtual machine's
    hypervisor ran something else while a CPU of ours wanted to run is not a process of this machine that
    our threads would compete with. Leaving a core idle because of steal would only add to what was
    lost (the other lane pulls the pieces a stolen core does not get to)."""
    busy = 0
    seen = False
    for line in stat.splitlines():
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        name, *fields = line.split()
        try:  # user nice system idle iowait irq softirq, then steal and the guests' (in user already)
            cpu = int(name[3:])
            user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in fields[:7])
        except ValueError:  # not a CPU's line, or one too short
            continue
        if cpus is not None and cpu not in cpus:
            continue
        busy += user + nice + system + irq + softirq
        seen = True
    return busy if seen else None


def _own_seconds() -> float:
    t = os.times()
    return t.user + t.system


class CoreBudget:
    """How many threads vmem's work may keep busy at once.

    ``threads`` is the cores this process may run on less the cores that other processes kept busy
    since the previous sample (the machine's busy time from /proc/stat less this process's own CPU
    time), rounded, at least 1. The figure moves only when the free cores measured differ from it by
    more than :attr:`HYSTERESIS` (on two cores: it drops to 1 when others keep more than 0.75 of a
    core busy, and comes back to 2 below 0.25), so that a short-lived process does not flip the step
    between its one- and two-lane forms. A virtual machine's steal (its hypervisor running something
    else) does not count as busy: no thread of this machine competes for that time. The first sample
    watches the machine for :attr:`FIRST_LOOK` seconds (a plan's profile, made at the first step,
    then runs as the steps after it will). Samples closer together than ``interval`` seconds keep the
    previous figure, so a step of a few milliseconds costs nothing. Where /proc/stat cannot be read,
    every core counts as free. ``fixed`` pins the figure (also :meth:`fix`, or the environment: ``VMEM_THREADS=2``).

    On a machine of up to two cores the figure changes the speed of a step, not its results: BLAS
    runs single-threaded either way, and the layers cut their work by shape (:mod:`vmem.nn.lanes`).
    With more cores, BLAS's threads follow the figure, and OpenBLAS can round the last bits of some
    products differently with a different thread count: there, pin it to compare runs bit for bit.
    """

    #: how far the free cores measured must be from the figure to change it (see the class docstring)
    HYSTERESIS = 0.75
    #: seconds the first sample watches the machine (once per process, or after :meth:`fix`)
    FIRST_LOOK = 0.1

    def __init__(
        self, ncores: int | None = None, *, interval: float = 0.25, fixed: int | None = None, env: bool = True
    ):
        self._cpus = _affinity()
        self.cores = ncores or cores()
        self.interval = interval
        self.others = 0.0  # cores other processes kept busy over the last interval
        self._lock = threading.Lock()
        self._last: tuple[float, float, float] | None = None
        self._controller: Any = None
        self._modules = 0  # len(sys.modules) when the controller looked
        self.lanes = 1  # lanes the step in progress runs side by side (see limit)
        self._holders = 0  # limit()s in progress, whichever thread (ranks of a ThreadGroup step at once)
        self._outer = 1  # the lanes before the first of them
        self._held = threading.Lock()
        given = os.environ.get("VMEM_THREADS") if env else None
        if fixed is None and given:
            try:
                fixed = int(given)
            except ValueError:
                raise ValueError(f"VMEM_THREADS must be a whole number of threads, not {given!r}") from None
            if not 1 <= fixed <= self.cores:  # more threads than cores only slows every step down
                clamped = min(max(fixed, 1), self.cores)
                warnings.warn(
                    f"VMEM_THREADS={given}: this machine has {self.cores} core(s); allowed are 1 to "
                    f"{self.cores}; using {clamped}",
                    RuntimeWarning,
                    stacklevel=2,
                )
                fixed = clamped
        self.fix(fixed)

    def fix(self, threads: int | None) -> None:
        """Pin the budget at ``threads`` (None: measure again). Beyond two cores, results of BLAS calls
        can depend on how many threads ran them (OpenBLAS splits some products differently), so two
        runs are bitwise comparable only under the same figure: pin it where that matters."""
        if threads is not None and threads < 1:
            raise ValueError(f"a core budget needs at least 1 thread, not {threads}")
        with self._lock:
            self.fixed = threads
            self.threads = threads or self.cores
            self._last = None

    def sample(self) -> int:
        """Measure what other processes left free since the last sample; return :attr:`threads`."""
        if self.fixed is not None:
            return self.fixed
        now = time.monotonic()
        with self._lock:
            last = self._last
            if last is not None and now - last[0] < self.interval:
                return self.threads
            if last is None:  # the first sample: a short look at the machine first, not a guess
                last = self._reading(now)
                if last is None:
                    return self.threads
                time.sleep(self.FIRST_LOOK)
                now = time.monotonic()
            reading = self._reading(now)
            if reading is None:
                return self.threads
            self._last = reading
            wall = now - last[0]
            if wall <= 0:
                return self.threads
            self.others = max(0.0, ((reading[1] - last[1]) - (reading[2] - last[2])) / wall)
            free = self.cores - self.others
            if abs(free - self.threads) > self.HYSTERESIS:  # a clear change, not a flicker
                self.threads = max(1, min(self.cores, int(free + 0.5)))
            return self.threads

    def _reading(self, now: float) -> tuple[float, float, float] | None:
        busy = _busy_seconds(self._cpus)
        return None if busy is None else (now, busy, _own_seconds())

    @contextlib.contextmanager
    def limit(self) -> Iterator[int]:
        """Run the body (a step) under a fresh :meth:`sample`; yields the figure.

        With exactly :data:`LANES` threads, BLAS runs single-threaded and :attr:`lanes` is LANES: the CPU
        layers run their pieces of work side by side (:mod:`vmem.device.lanes`). Otherwise BLAS's threads
        are capped at the figure and the pieces run in turn. Call it from the main thread: OpenBLAS
        (0.3.31) ignores a thread count set from any other thread."""
        threads = self.sample()
        lanes = LANES if threads == LANES else 1
        controller = self._blas()
        with self._held:  # steps running at once (threads of one process) share the figure; the last out
            self._holders += 1  # puts the lanes back as they were before the first
            if self._holders == 1:
                self._outer = self.lanes
            self.lanes = lanes
        try:
            if controller is None:
                yield threads
            else:
                with controller.limit(limits=1 if lanes > 1 else threads, user_api="blas"):
                    yield threads
        finally:
            with self._held:
                self._holders -= 1
                if self._holders == 0:
                    self.lanes = self._outer

    def _blas(self) -> Any:
        """threadpoolctl's view of the BLAS libraries loaded, looked at again after new imports (a
        library imported later, such as SciPy's own OpenBLAS, would otherwise keep its threads)."""
        modules = len(sys.modules)
        if self._controller is None or (self._controller is not False and modules != self._modules):
            try:
                from threadpoolctl import ThreadpoolController
            except ImportError:  # pragma: no cover - a core dependency
                self._controller = False
            else:
                self._controller = ThreadpoolController()
                self._modules = len(sys.modules)
        return self._controller or None

    def __repr__(self) -> str:
        return f"CoreBudget(threads={self.threads} of {self.cores} cores, others busy {self.others:.2f})"


def _process_budget() -> CoreBudget:
    try:
        return CoreBudget()
    except ValueError as exc:  # a bad VMEM_THREADS must not make vmem unimportable
        import warnings

        warnings.warn(f"{exc}; measuring the budget instead", RuntimeWarning, stacklevel=3)
        return CoreBudget(env=False)


#: The budget every vmem thread shares (BLAS's threads are process-wide, so one budget per process).
BUDGET = _process_budget()


class WorkerPool:
    """A thread pool made on first use that can be shut down (joining its threads) and made again.

    Submissions and shutdown take one lock, so work submitted before a shutdown finishes before the
    threads are joined, and work submitted after it goes to a new pool."""

    def __init__(self, name: str, workers: Callable[[], int]):
        self.name = name
        self._workers = workers
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None

    @property
    def running(self) -> bool:
        return self._executor is not None

    def _get(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                max_workers=max(1, self._workers()), thread_name_prefix=f"{PREFIX}{self.name}"
            )
        return self._executor

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        with self._lock:
            return self._get().submit(fn, *args)

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> list[Any]:
        """``[fn(i) for i in items]`` on the pool's threads; re-raises the first error."""
        with self._lock:
            ex = self._get()
            futures = [ex.submit(fn, i) for i in items]
        return [f.result() for f in futures]

    def shutdown(self) -> None:
        """Finish submitted work and join the threads (a later submission starts a new pool)."""
        with self._lock:
            ex, self._executor = self._executor, None
        if ex is not None:
            ex.shutdown(wait=True)


#: Workers that run one codec kernel's grid split over the cores.
KERNELS = WorkerPool("codec", lambda: min(cores(), 8))
#: One thread that carries the pieces of a transfer through a codec over the link, one at a time.
LINK = WorkerPool("link", lambda: 1)
#: The threads of the lanes beyond the first (which runs on the thread that asked): see :mod:`vmem.device.lanes`.
LANE = WorkerPool("lane", lambda: LANES - 1)
_POOLS = (KERNELS, LINK, LANE)

_holders = 0
_holders_lock = threading.Lock()


def hold() -> None:
    """A device is made: it holds the helper pools until it :func:`release` s them."""
    global _holders
    with _holders_lock:
        _holders += 1


def release() -> None:
    """A device is closed: when no device holds the pools any more, shut them all down."""
    global _holders
    with _holders_lock:
        _holders = max(0, _holders - 1)
        last = _holders == 0
    if last:
        shutdown()


def shutdown() -> None:
    """Shut every helper pool down and join its threads."""
    for pool in _POOLS:
        pool.shutdown()
