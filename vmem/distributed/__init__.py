"""Several processes training one network data-parallel: process groups and their collectives.

A :class:`ProcessGroup` is what a :class:`vmem.Trainer` given ``group=`` talks to: its ``rank`` and
``size``, and the collectives data-parallel training needs (``allreduce`` of gradients, ``broadcast`` of
the starting weights, ``allgather``, ``barrier``). Three kinds:

- :class:`LocalGroup`: one process (size 1); every collective is the identity.
- :class:`MPIGroup`: the processes ``mpiexec`` started, through mpi4py (the ``mpi`` extra installs mpi4py
  and MPICH's runtime as wheels: no system package). ``vmem train --nproc N`` launches it.
- :class:`ThreadGroup`: ``size`` ranks as threads of one process, each with its own device (tests, and a
  reference that sums the ranks' gradients in one process).
- :class:`NCCLGroup`: one process a GPU, collectives on device (CuPy) arrays through NCCL
  (``cupy.cuda.nccl``, the ``nvidia-nccl`` wheel), enqueued on the stream that calls them; the ranks meet
  over MPI to share NCCL's id (size 1 needs none). Its sums are NCCL's (reproducible on one machine and
  topology, not in rank order).

Sums are reproducible: :meth:`ProcessGroup.allreduce` gathers every rank's values and adds them in rank
order (``g0 + g1 + ...``), the same on every rank and the same as one process adding the shards' gradients
in that order, a chunk at a time (at most :data:`CHUNK` values per rank held as scratch). A collective
that waits longer than ``timeout`` seconds for the other ranks raises :class:`~vmem.errors.DistributedError`
(a rank that died or hangs never hangs the others); an error on one rank under ``mpiexec`` ends the run
(:func:`abort_on_error`).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np

from ..errors import DistributedError

__all__ = [
    "ProcessGroup",
    "LocalGroup",
    "MPIGroup",
    "ThreadGroup",
    "NCCLGroup",
    "init",
    "shard",
    "abort_on_error",
    "launched",
    "CHUNK",
    "TIMEOUT",
]

#: Values a rank gathers per collective call (the scratch is ``size`` times this, per rank).
CHUNK = 1 << 20
#: Seconds a collective waits for the other ranks before it gives up (``VMEM_DIST_TIMEOUT``).
TIMEOUT = float(os.environ.get("VMEM_DIST_TIMEOUT", "300"))


@runtime_checkable
class ProcessGroup(Protocol):
    """The ranks training one network together (see the module docstring)."""

    rank: int
    size: int
    backend: str

    def allreduce(self, array: Any) -> None:
        """``array`` (any shape, contiguous) replaced, on every rank, by the sum of every rank's, added in
        rank order."""

    def allreduce_many(self, arrays: list[Any]) -> None:
        """:meth:`allreduce` of each of ``arrays`` (a bucket of gradients), in as few calls as the transport
        needs."""

    def broadcast(self, array: Any, root: int = 0) -> None:
        """``array`` replaced by rank ``root``'s on every rank."""

    def broadcast_many(self, arrays: list[tuple[Any, int]]) -> None:
        """:meth:`broadcast` of each ``(array, root)``, in as few calls as the transport needs."""

    def allgather(self, array: Any) -> list[Any]:
        """Every rank's ``array`` (one shape and dtype on every rank), in rank order."""

    def barrier(self) -> None:
        """Return once every rank has called it."""

    def dup(self) -> "ProcessGroup":
        """The same ranks on a channel of their own: its collectives never match this group's (work on two
        threads, gradient buckets and batch norm's statistics, cannot cross). Every rank calls it, in the
        same order."""

    def close(self) -> None:
        """Release the group's resources (the ranks stay up)."""


def _sum_in_order(parts: Any, out: Any) -> None:
    """``out = parts[0] + parts[1] + ...``, added in that order (the same bits wherever it runs)."""
    np.copyto(out, parts[0])
    for p in parts[1:]:
        out += p


def _each(group: Any, arrays: list[Any]) -> None:
    for a in arrays:
        group.allreduce(a)


def _each_from(group: Any, arrays: list[tuple[Any, int]]) -> None:
    for a, root in arrays:
        group.broadcast(a, root)


def _chunks(flats: list[Any]) -> list[list[Any]]:
    """``flats`` (1-D views) cut into runs of at most :data:`CHUNK` values, in order (a longer one alone in
    pieces of CHUNK)."""
    out: list[list[Any]] = []
    run: list[Any] = []
    count = 0
    for f in flats:
        for lo in range(0, f.size, CHUNK):
            piece = f[lo : lo + CHUNK]
            if run and count + piece.size > CHUNK:
                out.append(run)
                run, count = [], 0
            run.append(piece)
            count += piece.size
    if run:
        out.append(run)
    return out


class LocalGroup:
    """One process: rank 0 of 1."""

    rank, size, backend = 0, 1, "local"

    def allreduce(self, array: Any) -> None:
        return None

    def broadcast(self, array: Any, root: int = 0) -> None:
        return None

    def allreduce_many(self, arrays: list[Any]) -> None:
        return None

    def broadcast_many(self, arrays: list[tuple[Any, int]]) -> None:
        return None

    def allgather(self, array: Any) -> list[Any]:
        return [np.array(array)]

    def barrier(self) -> None:
        return None

    def dup(self) -> "LocalGroup":
        return self

    def close(self) -> None:
        return None

    def __repr__(self) -> str:
        return "LocalGroup()"


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

    def allreduce(self, array: Any) -> None:
        self.allreduce_many([array])

    def allreduce_many(self, arrays: list[Any]) -> None:
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

    def broadcast(self, array: Any, root: int = 0) -> None:
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

    def allgather(self, array: Any) -> list[Any]:
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

    def _gather(self, array: Any, what: str) -> list[Any]:
        self._r.slots[self.rank] = np.array(array)  # this rank's values, copied
        self._r.meet(self.rank, what)
        parts = list(self._r.slots)
        self._r.meet(self.rank, what)  # every rank has read them before any writes its next
        return parts

    def allreduce(self, array: Any) -> None:
        if self.size > 1:
            _sum_in_order(self._gather(array, "an all-reduce"), array)

    def broadcast(self, array: Any, root: int = 0) -> None:
        if self.size > 1:
            array[...] = self._gather(array, "a broadcast")[root]

    def allreduce_many(self, arrays: list[Any]) -> None:
        _each(self, arrays)

    def broadcast_many(self, arrays: list[tuple[Any, int]]) -> None:
        _each_from(self, arrays)

    def allgather(self, array: Any) -> list[Any]:
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


class NCCLGroup:
    """The GPUs of a data-parallel run, one a process, through NCCL (see the module docstring). ``mpi``: an
    :class:`MPIGroup` of the same processes, to share NCCL's id (None for one process). Collectives take
    CuPy arrays and run on the current CuPy stream (the executor's communication stream); host (NumPy)
    arrays, the starting weights a Trainer broadcasts, are copied through the device."""

    backend = "nccl"

    def __init__(self, mpi: MPIGroup | None = None):
        try:
            import cupy
            from cupy.cuda import nccl
        except ImportError:
            raise ImportError(
                "vmem.distributed.NCCLGroup needs CuPy with NCCL (pip install 'vmem[cuda]' nvidia-nccl-cu13)"
            ) from None
        self._cupy, self._nccl = cupy, nccl
        self.rank, self.size = (0, 1) if mpi is None else (mpi.rank, mpi.size)
        uid = nccl.get_unique_id() if self.rank == 0 else None
        if mpi is not None and mpi.size > 1:
            uid = mpi.comm.bcast(uid, root=0)  # type: ignore[union-attr]
        self.comm = nccl.NcclCommunicator(self.size, uid, self.rank)
        self._types = {
            np.dtype(np.float32): nccl.NCCL_FLOAT32,
            np.dtype(np.float16): nccl.NCCL_FLOAT16,
            np.dtype(np.float64): nccl.NCCL_FLOAT64,
            np.dtype(np.int64): nccl.NCCL_INT64,
            np.dtype(np.int32): nccl.NCCL_INT32,
            np.dtype(np.uint8): nccl.NCCL_UINT8,
        }

    def _type(self, array: Any) -> Any:
        kind = self._types.get(np.dtype(array.dtype))
        if kind is None:
            raise DistributedError(f"rank {self.rank}: NCCL takes no {array.dtype} arrays")
        return kind

    def _on_device(self, array: Any, fn: Callable[[Any], None]) -> None:
        """``fn`` on ``array``, copied through the device where it is a host array."""
        if isinstance(array, np.ndarray):
            dev = self._cupy.asarray(array)
            fn(dev)
            array[...] = self._cupy.asnumpy(dev)
        else:
            fn(array)

    def allreduce(self, array: Any) -> None:
        stream = self._cupy.cuda.get_current_stream().ptr

        def run(a: Any) -> None:
            self.comm.allReduce(a.data.ptr, a.data.ptr, a.size, self._type(a), self._nccl.NCCL_SUM, stream)

        self._on_device(array, run)

    def broadcast(self, array: Any, root: int = 0) -> None:
        stream = self._cupy.cuda.get_current_stream().ptr
        self._on_device(array, lambda a: self.comm.bcast(a.data.ptr, a.size, self._type(a), root, stream))

    def allreduce_many(self, arrays: list[Any]) -> None:  # each enqueued on the stream: calls are cheap
        _each(self, arrays)

    def broadcast_many(self, arrays: list[tuple[Any, int]]) -> None:
        _each_from(self, arrays)

    def allgather(self, array: Any) -> list[Any]:
        a = self._cupy.ascontiguousarray(self._cupy.asarray(array))
        out = self._cupy.empty((self.size,) + a.shape, a.dtype)
        stream = self._cupy.cuda.get_current_stream().ptr
        self.comm.allGather(a.data.ptr, out.data.ptr, a.size, self._type(a), stream)
        return list(self._cupy.asnumpy(out))

    def barrier(self) -> None:
        one = self._cupy.ones(1, self._cupy.float32)
        self.allreduce(one)
        self._cupy.cuda.get_current_stream().synchronize()

    def dup(self) -> "NCCLGroup":
        raise DistributedError(
            "NCCLGroup.dup: a second NCCL channel (synchronized batch norm on GPUs) is not wired yet"
        )

    def close(self) -> None:
        if self.comm is not None:
            self.comm.destroy()
            self.comm = None

    def __repr__(self) -> str:
        return f"NCCLGroup(rank={self.rank}, size={self.size})"


def launched() -> bool:
    """Whether this process is one of several an MPI launcher started (``mpiexec -n N``, N > 1)."""
    for key in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"):
        value = os.environ.get(key)
        if value is not None and value.isdigit() and int(value) > 1:
            return True
    return False


def init(timeout: float | None = None, *, nccl: bool = False) -> ProcessGroup:
    """The group this process belongs to: where ``mpiexec`` started several, an :class:`MPIGroup` (with
    ``nccl``, for ranks that train on GPUs: an :class:`NCCLGroup` over it), else a :class:`LocalGroup`."""
    if launched():
        mpi = MPIGroup(timeout=timeout)
        return NCCLGroup(mpi) if nccl else mpi
    return LocalGroup()


def shard(n: int, rank: int, size: int) -> slice:
    """Rank ``rank``'s rows of a batch of ``n`` (``n`` a multiple of ``size``): the ``rank``-th of ``size``
    equal, contiguous pieces."""
    if n % size:
        raise ValueError(f"a batch of {n} does not split into {size} equal shards")
    per = n // size
    return slice(rank * per, (rank + 1) * per)


def abort_on_error(group: ProcessGroup, fn: Callable[[], Any]) -> Any:
    """``fn()``; where it raises on a rank of an MPI job, that rank says so in one line and the job ends (so
    that the other ranks never wait for it). A stop the ranks agreed on (KeyboardInterrupt after the same
    step on every rank) and an exit are left to the caller."""
    try:
        return fn()
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:
        if getattr(group, "backend", "") == "mpi" and group.size > 1:
            print(f"vmem: rank {group.rank} of {group.size}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            group.comm.Abort(1)  # type: ignore[attr-defined]
        raise
