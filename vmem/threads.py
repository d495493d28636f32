"""Helper threads vmem starts besides the stream workers: the codec kernels' workers and the link thread
of transfers through a codec.

Each is a :class:`WorkerPool`, made on first use. Devices hold them: every device calls :func:`hold`
when it is made and :func:`release` when it is closed, and when the last device closes every pool is
shut down and its threads joined, so that no thread vmem started outlives ``close()``. A pool used
again afterwards (a codec called on its own) starts anew; :func:`shutdown` stops them all at any time.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterable

__all__ = ["WorkerPool", "KERNELS", "LINK", "hold", "release", "shutdown", "PREFIX", "cores"]

#: Name prefix of every helper thread vmem starts (stream workers are ``vmem-stream-...``).
PREFIX = "vmem-"


def cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


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
            self._executor = ThreadPoolExecutor(max_workers=max(1, self._workers()),
                                                thread_name_prefix=f"{PREFIX}{self.name}")
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
_POOLS = (KERNELS, LINK)

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
