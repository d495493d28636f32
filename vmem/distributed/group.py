"""The process-group protocol the Trainer talks to, the one-process group, and what every backend shares:
sums in rank order a chunk at a time, a rank's share of a batch, the launch check, the abort on an error."""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Protocol, TYPE_CHECKING, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from .._typing import Array


__all__ = ["ProcessGroup", "LocalGroup", "shard", "abort_on_error", "launched", "CHUNK", "TIMEOUT"]


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

    def allreduce(self, array: Array) -> None:
        """``array`` (any shape, contiguous) replaced, on every rank, by the sum of every rank's, added in
        rank order."""

    def allreduce_many(self, arrays: list[Array]) -> None:
        """:meth:`allreduce` of each of ``arrays`` (a bucket of gradients), in as few calls as the transport
        needs."""

    def broadcast(self, array: Array, root: int = 0) -> None:
        """``array`` replaced by rank ``root``'s on every rank."""

    def broadcast_many(self, arrays: list[tuple[Any, int]]) -> None:
        """:meth:`broadcast` of each ``(array, root)``, in as few calls as the transport needs."""

    def allgather(self, array: Array) -> list[Any]:
        """Every rank's ``array`` (one shape and dtype on every rank), in rank order."""

    def barrier(self) -> None:
        """Return once every rank has called it."""

    def dup(self) -> "ProcessGroup":
        """The same ranks on a channel of their own: its collectives never match this group's (work on two
        threads, gradient buckets and batch norm's statistics, cannot cross). Every rank calls it, in the
        same order."""

    def close(self) -> None:
        """Release the group's resources (the ranks stay up)."""


def _sum_in_order(parts: Any, out: Array) -> None:
    """``out = parts[0] + parts[1] + ...``, added in that order (the same bits wherever it runs)."""
    np.copyto(out, parts[0])
    for p in parts[1:]:
        out += p


def _each(group: ProcessGroup, arrays: list[Array]) -> None:
    for a in arrays:
        group.allreduce(a)


def _each_from(group: ProcessGroup, arrays: list[tuple[Any, int]]) -> None:
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

    def allreduce(self, array: Array) -> None:
        return None

    def broadcast(self, array: Array, root: int = 0) -> None:
        return None

    def allreduce_many(self, arrays: list[Array]) -> None:
        return None

    def broadcast_many(self, arrays: list[tuple[Any, int]]) -> None:
        return None

    def allgather(self, array: Array) -> list[Any]:
        return [np.array(array)]

    def barrier(self) -> None:
        return None

    def dup(self) -> "LocalGroup":
        return self

    def close(self) -> None:
        return None

    def __repr__(self) -> str:
        return "LocalGroup()"


def launched() -> bool:
    """Whether this process is one of several an MPI launcher started (``mpiexec -n N``, N > 1)."""
    for key in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"):
        value = os.environ.get(key)
        if value is not None and value.isdigit() and int(value) > 1:
            return True
    return False


def share(n: int, size: int) -> int:
    """How many of a batch of ``n`` samples each of ``size`` ranks takes (``n`` a multiple of ``size``)."""
    if n % size:
        raise ValueError(f"a batch of {n} does not split into {size} equal shards")
    return n // size


def shard(n: int, rank: int, size: int) -> slice:
    """Rank ``rank``'s rows of a batch of ``n`` (``n`` a multiple of ``size``): the ``rank``-th of ``size``
    equal, contiguous pieces."""
    per = share(n, size)
    return slice(rank * per, (rank + 1) * per)


def abort(group: ProcessGroup, code: int) -> None:
    """End the whole job now with exit status ``code`` where ``group`` is an MPI job's (MPI's Abort: every rank,
    so that none waits for this one); a group of one process, or of threads, is left to its caller."""
    mpi = getattr(group, "mpi", group)  # NCCL's ranks are an MPI job's
    comm = getattr(mpi, "comm", None)
    if getattr(mpi, "backend", "") == "mpi" and mpi.size > 1 and comm is not None:
        comm.Abort(code)


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
            abort(group, 1)
        raise
