"""What a Trainer does differently on the ranks of a data-parallel run: the group checked against the device,
rank 0's weights given to every rank, each rank's share of a batch, the optimizer state gathered from the
ranks that keep its shares (ZeRO stage 1), checkpoints written by rank 0 while the others wait."""

from __future__ import annotations

from typing import Any, Callable, Sequence, TYPE_CHECKING

import numpy as np

from ..errors import DeviceError
from ..schedule.collectives import owners
from .group import LocalGroup, ProcessGroup, shard

if TYPE_CHECKING:
    from ..device.base import Device
    from ..graph.program import Program

__all__ = ["training_group", "batch_share", "gathered_optimizer_state", "written_by_rank_0"]


def training_group(group: ProcessGroup | None, device: Device, params: dict[str, np.ndarray]) -> ProcessGroup | None:
    """The ranks a Trainer on ``device`` trains with (None for one process), every rank's ``params`` made rank
    0's. MPI and threads sum host arrays, NCCL a GPU's: a group that does not sum the device's arrays is
    refused."""
    if group is None or isinstance(group, LocalGroup):
        return None
    on_device = group.backend == "nccl"
    if device.ops is not None and device.ops.host == on_device:
        raise DeviceError(
            f"{group!r} sums "
            + ("a GPU's arrays: train on a CUDA device" if on_device else "host arrays: train on the CPU device")
            + f", not {device.name} (NCCLGroup for a CUDA device)"
        )
    for value in params.values():  # every rank starts from rank 0's weights
        group.broadcast(value)
    return group


def batch_share(group: ProcessGroup | None, batch_size: int) -> slice | None:
    """This rank's rows of every batch of ``batch_size`` (None for one process); a batch that does not split
    into equal shards is refused."""
    ranks = 1 if group is None else group.size
    if batch_size % ranks:
        raise ValueError(
            f"fit: batch_size={batch_size} does not split into {ranks} equal shards, one a rank; give a "
            f"multiple of {ranks}"
        )
    return None if group is None else shard(batch_size, group.rank, ranks)


def gathered_optimizer_state(
    group: ProcessGroup,
    own: dict[str, np.ndarray],
    program: Program,
    specs: dict[str, Any],
    slots: Sequence[str],
) -> dict[str, np.ndarray]:
    """The optimizer's whole state where it is sharded over the ranks: each parameter's slots (``own`` holds
    this rank's, as ``"name:slot"``) from the rank that keeps them. Every rank calls this, in step."""
    keeper = owners(program, group.size)
    dtype = np.dtype(program.precision.optimizer_state)
    state = {
        f"{name}:{slot}": own.get(f"{name}:{slot}", np.empty(specs[name].shape, dtype))
        for name in keeper
        for slot in slots
    }
    group.broadcast_many([(v, keeper[k.rpartition(":")[0]]) for k, v in state.items()])
    return state


def written_by_rank_0(group: ProcessGroup | None, write: Callable[[], None]) -> None:
    """``write()`` on rank 0 (or the one process), the other ranks waiting until it is done (the ranks hold
    the same state: one file)."""
    if group is not None and group.rank != 0:
        group.barrier()  # rank 0 is writing
        return
    try:
        write()
    finally:
        if group is not None:
            group.barrier()
