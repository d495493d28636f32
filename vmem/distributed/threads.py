"""``size`` ranks as threads of one process, each with its own device: tests, and a reference that sums the
ranks' gradients in one process."""

from __future__ import annotations

import threading
from typing import Any, TYPE_CHECKING

import numpy as np

from ..errors import DistributedError
from .group import TIMEOUT, _each, _each_from, _sum_in_order

if TYPE_CHECKING:
    from .._typing import Array

__all__ = ["ThreadGroup"]


class _Rendezvous:
    """What the ranks of a :class:`ThreadGroup` share: one slot a rank, a barrier."""

    def __init__(self, size: int, timeout: float):
        self.size, self.timeout = size, timeout
        self.slots: list[Any] = [None] * size
        self.barrier = threading.Barrier(size)
        self.lock = threading.Lock()
        self.channels: list["_Rendezvous"] = []  # the k-th dup of every rank meets at the k-th

    def channel(self, k: int) -> "_Rendezvous":
        with self.lock:
            while len(self.channels) <= k:
                self.channels.append(_Rendezvous(self.size, self.timeout))
            return self.channels[k]

    def meet(self, rank: int, what: str) -> None:
        try:
            self.barrier.wait(self.timeout)
        except threading.BrokenBarrierError:
            raise DistributedError(
                f"rank {rank} of {self.size}: {what}: another rank stopped (or waited over {self.timeout:g} s)"
            ) from None


class ThreadGroup:
    """Rank ``rank`` of ``size`` ranks that are threads of this process (:meth:`make` gives them all).
    Collectives meet at a barrier and add in rank order, as :class:`MPIGroup` does."""

    backend = "threads"

    def __init__(self, rank: int, rendezvous: _Rendezvous):
        self.rank, self.size, self._r = rank, rendezvous.size, rendezvous
        self._dups = 0

    @classmethod
    def make(cls, size: int, timeout: float | None = None) -> list["ThreadGroup"]:
        """The ``size`` ranks' groups, rank order."""
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"ThreadGroup.make: size={size!r} must be a positive int")
        r = _Rendezvous(size, TIMEOUT if timeout is None else float(timeout))
        return [cls(i, r) for i in range(size)]

    def _gather(self, array: Array, what: str) -> list[Any]:
        self._r.slots[self.rank] = np.array(array)  # this rank's values, copied
        self._r.meet(self.rank, what)
        parts = list(self._r.slots)
        self._r.meet(self.rank, what)  # every rank has read them before any writes its next
        return parts

    def allreduce(self, array: Array) -> None:
        if self.size > 1:
            _sum_in_order(self._gather(array, "an all-reduce"), array)

    def broadcast(self, array: Array, root: int = 0) -> None:
        if self.size > 1:
            array[...] = self._gather(array, "a broadcast")[root]

    def allreduce_many(self, arrays: list[Array]) -> None:
        _each(self, arrays)

    def broadcast_many(self, arrays: list[tuple[Any, int]]) -> None:
        _each_from(self, arrays)

    def allgather(self, array: Array) -> list[Any]:
        return self._gather(array, "an all-gather")

    def barrier(self) -> None:
        self._r.meet(self.rank, "a barrier")

    def dup(self) -> "ThreadGroup":
        self._dups += 1
        return ThreadGroup(self.rank, self._r.channel(self._dups - 1))

    def close(self) -> None:
        self._r.barrier.abort()  # ranks still waiting learn that this one left
        for channel in self._r.channels:
            channel.barrier.abort()

    def __repr__(self) -> str:
        return f"ThreadGroup(rank={self.rank}, size={self.size})"
