"""The processes ``mpiexec`` started, as one process group, through mpi4py (the ``mpi`` extra)."""

from __future__ import annotations

import threading
import time
from typing import Any, TYPE_CHECKING

import numpy as np

from ..errors import DistributedError
from .group import TIMEOUT, _chunks, _sum_in_order

if TYPE_CHECKING:
    from .._typing import Array

__all__ = ["MPIGroup"]


class MPIGroup:
    """The processes of an MPI job (mpi4py's ``COMM_WORLD``, duplicated), collectives on host (NumPy)
    arrays. Each collective is started non-blocking and polled, so that a rank that stopped answering is
    reported after ``timeout`` seconds instead of hanging the others."""

    backend = "mpi"

    def __init__(self, comm: Any = None, timeout: float | None = None):
        try:
            from mpi4py import MPI
        except ImportError:
            raise ImportError(
                "vmem.distributed.MPIGroup needs mpi4py and an MPI runtime: pip install 'vmem[mpi]'"
            ) from None
        self._mpi = MPI
        self.comm = (comm or MPI.COMM_WORLD).Dup()
        self.comm.Set_errhandler(MPI.ERRORS_RETURN)
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.timeout = TIMEOUT if timeout is None else float(timeout)
        self._lock = threading.Lock()  # one collective at a time, whichever thread (a stream's) calls it
        from .launch import note_shared_memory

        note_shared_memory()  # for `vmem train --nproc`'s launcher to remove, however the job ends

    def _wait(self, request: Any, what: str) -> None:
        deadline = time.monotonic() + self.timeout
        pause = 1e-5
        while True:
            try:
                if request.Test():
                    return
            except self._mpi.Exception as exc:
                raise DistributedError(f"rank {self.rank} of {self.size}: {what} failed: {exc}") from None
            if time.monotonic() > deadline:
                raise DistributedError(
                    f"rank {self.rank} of {self.size}: {what} waited {self.timeout:g} s for the other ranks; a rank "
                    "stopped or hangs (VMEM_DIST_TIMEOUT sets the wait)"
                )
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)

    def allreduce(self, array: Array) -> None:
        self.allreduce_many([array])

    def allreduce_many(self, arrays: list[Array]) -> None:
        """The arrays' values packed a chunk (:data:`CHUNK` values) at a time: one all-gather a chunk, then
        each rank adds the ranks' values in rank order into the arrays (the same bits as one at a time)."""
        if self.size == 1:
            return
        for dtype in dict.fromkeys(np.dtype(a.dtype) for a in arrays):
            flats = [a.reshape(-1) for a in arrays if np.dtype(a.dtype) == dtype and a.size]
            with self._lock:
                for pieces in _chunks(flats):
                    count = sum(p.size for p in pieces)
                    send = np.concatenate(pieces) if len(pieces) > 1 else np.ascontiguousarray(pieces[0])
                    parts = np.empty((self.size, count), dtype)
                    self._wait(self.comm.Iallgather(send, parts), "an all-reduce")
                    at = 0
                    for p in pieces:
                        _sum_in_order(parts[:, at : at + p.size], p)
                        at += p.size

    def broadcast(self, array: Array, root: int = 0) -> None:
        self.broadcast_many([(array, root)])

    def broadcast_many(self, arrays: list[tuple[Any, int]]) -> None:
        """A chunk of each root's arrays at a time, packed: one broadcast a chunk."""
        if self.size == 1:
            return
        for root in sorted({r for _, r in arrays}):
            for dtype in dict.fromkeys(np.dtype(a.dtype) for a, r in arrays if r == root):
                flats = [a.reshape(-1) for a, r in arrays if r == root and np.dtype(a.dtype) == dtype and a.size]
                with self._lock:
                    for pieces in _chunks(flats):
                        buf = np.concatenate(pieces) if len(pieces) > 1 else np.ascontiguousarray(pieces[0])
                        self._wait(self.comm.Ibcast(buf, root=root), "a broadcast")
                        if self.rank != root:
                            at = 0
                            for p in pieces:
                                p[...] = buf[at : at + p.size]
                                at += p.size

    def allgather(self, array: Array) -> list[Any]:
        a = np.ascontiguousarray(array)
        out = np.empty((self.size,) + a.shape, a.dtype)
        with self._lock:
            self._wait(self.comm.Iallgather(a, out), "an all-gather")
        return list(out)

    def barrier(self) -> None:
        with self._lock:
            self._wait(self.comm.Ibarrier(), "a barrier")

    def dup(self) -> "MPIGroup":
        return MPIGroup(self.comm, self.timeout)

    def close(self) -> None:
        if self.comm is not None:
            self.comm.Free()
            self.comm = None

    def __repr__(self) -> str:
        return f"MPIGroup(rank={self.rank}, size={self.size})"
