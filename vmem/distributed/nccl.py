"""One process a GPU, collectives on device arrays through NCCL (``cupy.cuda.nccl``), enqueued on the stream
that calls them; the ranks meet over MPI to share NCCL's id."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ..errors import DistributedError
from .group import _each, _each_from

if TYPE_CHECKING:
    from .._typing import Array, GpuArray
    from .mpi import MPIGroup

__all__ = ["NCCLGroup"]


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
        #: the MPI job the ranks are (what ends them all: vmem.distributed.abort)
        self.mpi = mpi
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

    def _type(self, array: Array) -> Any:
        kind = self._types.get(np.dtype(array.dtype))
        if kind is None:
            raise DistributedError(f"rank {self.rank}: NCCL takes no {array.dtype} arrays")
        return kind

    def _on_device(self, array: Array, fn: Callable[[Any], None]) -> None:
        """``fn`` on ``array``, copied through the device where it is a host array."""
        if isinstance(array, np.ndarray):
            dev = self._cupy.asarray(array)
            fn(dev)
            array[...] = self._cupy.asnumpy(dev)
        else:
            fn(array)

    def allreduce(self, array: Array) -> None:
        stream = self._cupy.cuda.get_current_stream().ptr

        def run(a: GpuArray) -> None:
            self.comm.allReduce(a.data.ptr, a.data.ptr, a.size, self._type(a), self._nccl.NCCL_SUM, stream)

        self._on_device(array, run)

    def broadcast(self, array: Array, root: int = 0) -> None:
        stream = self._cupy.cuda.get_current_stream().ptr
        self._on_device(array, lambda a: self.comm.bcast(a.data.ptr, a.size, self._type(a), root, stream))

    def allreduce_many(self, arrays: list[Array]) -> None:  # each enqueued on the stream: calls are cheap
        _each(self, arrays)

    def broadcast_many(self, arrays: list[tuple[Any, int]]) -> None:
        _each_from(self, arrays)

    def allgather(self, array: Array) -> list[Any]:
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
