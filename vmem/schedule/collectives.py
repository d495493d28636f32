"""Data-parallel training's collectives in a Schedule: gradient buckets all-reduced as backward makes them.

:func:`with_allreduce` is a pure transform of a lowered training Schedule (any policy's): the trainable
parameters are grouped into buckets in the order backward finishes their gradients (the last layer's
first), each bucket at most ``bucket_bytes`` (PyTorch DDP's 25 MiB), the last at most
``last_bucket_bytes`` (1 MiB: what is summed after backward has ended, so that little is), and an
:class:`AllReduce` of each bucket is
placed right after the step that finishes its last gradient, to run on the communication stream while
the rest of backward computes. The update waits for every bucket (:class:`WaitAllReduce`; the first update
decides for all whether the step is finite, so all are summed by then), then updates bucket by bucket.
A bucket names the gradients themselves: they are summed where they lie, with no second copy.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from .steps import AccumulateParam, AllReduce, Backward, Broadcast, Buffer, Kind, Schedule, Update, WaitAllReduce

if TYPE_CHECKING:
    from ..graph import Program

__all__ = [
    "with_allreduce",
    "with_sharded_optimizer",
    "buckets",
    "owners",
    "largest_share",
    "sharded_buffers",
    "BUCKET_BYTES",
    "LAST_BUCKET_BYTES",
]

#: A bucket's most gradient bytes (PyTorch DDP's default), and the last bucket's (see :func:`buckets`).
BUCKET_BYTES = 25 << 20
LAST_BUCKET_BYTES = 1 << 20


def _finished(schedule: Schedule) -> dict[str, int]:
    """Each trainable parameter's gradient -> the index of the step after which it is final (its layer's
    backward, or a shared parameter's last accumulation)."""
    program = schedule.program
    trainable = {f"{op.name}.{k}" for op, k, s in program.owned_params() if s.trainable}
    done: dict[str, int] = {}
    for i, st in enumerate(schedule.steps):
        if type(st) is Backward:
            op = program.ops[st.op]
            through_temp = schedule.param_acc.get(op.index, {})
            for k in op.params:
                name = op.param_key(k)
                if name in trainable and k not in through_temp:
                    done[name] = i
        elif type(st) is AccumulateParam and st.param in trainable:
            done[st.param] = i
    return {name: done[name] for name in sorted(done, key=done.__getitem__)} | {
        name: len(schedule.steps) for name in trainable - set(done)
    }


def buckets(
    schedule: Schedule, bucket_bytes: int = BUCKET_BYTES, last_bucket_bytes: int = LAST_BUCKET_BYTES
) -> list[tuple[tuple[str, ...], int, int]]:
    """The gradient buckets of a training step: (parameters, bytes, the index of the step that finishes
    the last of them), in the order backward finishes them. Packed from the end: the last bucket (the
    first layers', finished when backward ends, its sum the one nothing hides) holds at most
    ``last_bucket_bytes``, the others at most ``bucket_bytes`` (a parameter larger than that alone)."""
    program = schedule.program
    itemsize = program.precision.itemsize("gradients")
    size = {f"{op.name}.{k}": math.prod(s.shape) * itemsize for op, k, s in program.owned_params() if s.trainable}
    finished = _finished(schedule)
    packed: list[list[str]] = []
    names: list[str] = []
    nbytes = 0
    for name in reversed(finished):
        cap = last_bucket_bytes if not packed else bucket_bytes
        if names and nbytes + size[name] > cap:
            packed.append(names)
            names, nbytes = [], 0
        names.append(name)
        nbytes += size[name]
    if names:
        packed.append(names)
    return [
        (tuple(reversed(names)), sum(size[n] for n in names), max(finished[n] for n in names))
        for names in reversed(packed)
    ]


def with_allreduce(
    schedule: Schedule,
    world: int = 2,
    bucket_bytes: int = BUCKET_BYTES,
    last_bucket_bytes: int = LAST_BUCKET_BYTES,
) -> Schedule:
    """``schedule`` with its gradients all-reduced in buckets over ``world`` ranks (see the module
    docstring; the replay prices each all-reduce for that many). A schedule that updates nothing
    (inference) is returned as it is."""
    if not any(type(st) is Update for st in schedule.steps):
        return schedule
    if bucket_bytes < 1 or last_bucket_bytes < 1:
        raise ValueError(f"bucket sizes must be positive (bucket_bytes={bucket_bytes}, last={last_bucket_bytes})")
    found = buckets(schedule, bucket_bytes, last_bucket_bytes)
    after: dict[int, list[AllReduce]] = {}
    for b, (names, nbytes, at) in enumerate(found):
        after.setdefault(at, []).append(AllReduce(b, names, nbytes))
    steps: list = []
    for i, st in enumerate(schedule.steps):
        if type(st) is Update:
            if st.params is not None:
                raise ValueError("with_allreduce: the schedule updates in buckets already")
            steps += after.pop(len(schedule.steps), [])  # parameters no backward writes (none, usually)
            steps += [WaitAllReduce(b) for b in range(len(found))]
            steps += [Update(names) for names, _, _ in found]
            continue
        steps.append(st)
        steps += after.pop(i, [])
    return dataclasses.replace(schedule, steps=steps, world=world)


def _shares(program: "Program", world: int) -> tuple[dict[str, int], list[int]]:
    """(each trainable parameter's owner, the values each rank keeps state for): see :func:`owners`."""
    sizes = {f"{op.name}.{k}": math.prod(s.shape) for op, k, s in program.owned_params() if s.trainable}
    held = [0] * world
    out: dict[str, int] = {}
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        rank = min(range(world), key=lambda r: (held[r], r))
        out[name] = rank
        held[rank] += sizes[name]
    return out, held


def owners(program: "Program", world: int) -> dict[str, int]:
    """Which rank keeps (and updates) each trainable parameter's optimizer state when it is sharded over
    ``world`` ranks (ZeRO's stage 1, a parameter at a time): the largest first, each to the rank holding
    the fewest bytes so far (the lowest on a tie), so that every rank holds about 1/world of it. The same on
    every rank (it depends on the program alone)."""
    return _shares(program, world)[0]


def largest_share(program: "Program", world: int) -> int:
    """The rank that keeps the most optimizer state when it is sharded over ``world`` ranks (what a plan
    for every rank must fit)."""
    held = _shares(program, world)[1]
    return held.index(max(held))


def sharded_buffers(buffers: list[Buffer], own: dict[str, int], rank: int) -> list[Buffer]:
    """``buffers`` (a step's persistent ones) without the optimizer state other ranks keep."""
    return [b for b in buffers if not (b.key.kind is Kind.OPT_STATE and own.get(b.key.name, rank) != rank)]


def with_sharded_optimizer(schedule: Schedule, rank: int) -> Schedule:
    """``schedule`` (gradients all-reduced: :func:`with_allreduce`) as rank ``rank`` runs it with the
    optimizer's state sharded over the ranks (ZeRO's stage 1): it keeps the state of its own parameters only
    (:func:`owners`), updates only those, then every rank sends the weights it updated to the others
    (:class:`Broadcast`), so that all hold the same weights for the next step."""
    if schedule.world < 2:
        raise ValueError("with_sharded_optimizer: the schedule sums its gradients over no other rank (with_allreduce)")
    if not 0 <= rank < schedule.world:
        raise ValueError(f"with_sharded_optimizer: rank {rank} is not one of {schedule.world}")
    program = schedule.program
    own = owners(program, schedule.world)
    steps: list = []
    for st in schedule.steps:
        if type(st) is Update:
            steps.append(Update(tuple(p for p in (st.params or own) if own[p] == rank)))
        else:
            steps.append(st)
    last = max(i for i, st in enumerate(steps) if type(st) is Update)
    itemsize = program.precision.itemsize("parameters")
    order = [(f"{op.name}.{k}", math.prod(s.shape)) for op, k, s in program.owned_params() if s.trainable]
    sent = Broadcast(tuple((name, own[name]) for name, _ in order), sum(n for _, n in order) * itemsize)
    steps.insert(last + 1, sent)
    persistent = sharded_buffers(schedule.persistent, own, rank)
    return dataclasses.replace(schedule, steps=steps, persistent=persistent, shard_rank=rank)
