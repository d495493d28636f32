"""Several processes training one network data-parallel: process groups and their collectives.

A :class:`ProcessGroup` is what a :class:`vmem.Trainer` given ``group=`` talks to: its ``rank`` and
``size``, and the collectives data-parallel training needs (``allreduce`` of gradients, ``broadcast`` of
the starting weights, ``allgather``, ``barrier``). Four kinds, a module each (:mod:`.group` holds the
protocol and what they share; :mod:`.world` finds the group a rank is in; :mod:`.launch` starts the ranks of
``vmem train --nproc``):

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

from .group import CHUNK, TIMEOUT, LocalGroup, ProcessGroup, abort, abort_on_error, launched, shard, share
from .mpi import MPIGroup
from .nccl import NCCLGroup
from .threads import ThreadGroup
from .world import init

__all__ = [
    "ProcessGroup",
    "LocalGroup",
    "MPIGroup",
    "ThreadGroup",
    "NCCLGroup",
    "init",
    "shard",
    "share",
    "abort",
    "abort_on_error",
    "launched",
    "CHUNK",
    "TIMEOUT",
]
