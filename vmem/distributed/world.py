"""Which group this process belongs to, as the ranks of ``vmem train --nproc`` find it."""

from __future__ import annotations

from .group import LocalGroup, ProcessGroup, launched
from .mpi import MPIGroup
from .nccl import NCCLGroup

__all__ = ["init"]


def init(timeout: float | None = None, *, nccl: bool = False) -> ProcessGroup:
    """The group this process belongs to: where ``mpiexec`` started several, an
    :class:`~vmem.distributed.mpi.MPIGroup` (with ``nccl``, for ranks that train on GPUs: an
    :class:`~vmem.distributed.nccl.NCCLGroup` over it), else a :class:`LocalGroup`."""
    if launched():
        mpi = MPIGroup(timeout=timeout)
        return NCCLGroup(mpi) if nccl else mpi
    return LocalGroup()
