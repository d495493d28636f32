"""One rank of a data-parallel run for tests/distributed (``mpiexec -n N python -m tests.distributed.dp_worker``):
a small CNN without batch norm (or with, ``--bn``, synchronized) trained on its shard of fixed batches; each rank
writes its weights to ``OUT.rank{r}.npz``."""

from __future__ import annotations

import argparse
import os
import signal
import threading

import numpy as np

import vmem
from vmem import nn
from vmem.distributed import ThreadGroup, init, shard

BATCH, STEPS = 8, 20


def model(bn: bool = False) -> vmem.Sequential:
    layers = [nn.Conv2d(3, 4, 3, padding=1)] + ([nn.BatchNorm2d(4)] if bn else [])
    layers += [nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 4 * 4, 5)]
    return vmem.Sequential(*layers, input_shape=(3, 8, 8), name="dp_small").init(seed=1)


def batches(steps: int = STEPS) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.standard_normal((steps, BATCH, 3, 8, 8)).astype(np.float32), rng.integers(0, 5, (steps, BATCH))


def train(trainer: vmem.Trainer, rank: int, size: int, first: int, last: int, die_at: int | None = None) -> None:
    xs, ys = batches()
    for i in range(first, last):
        if die_at is not None and i == die_at and rank == size - 1:
            os.kill(os.getpid(), signal.SIGKILL)
        s = shard(BATCH, rank, size)
        trainer.step(xs[i][s], ys[i][s])


def on_ranks(size: int, fn, timeout: float = 60) -> list:
    """``fn(group)`` on each of ``size`` thread ranks; their results in rank order (the first error raised)."""
    results: list = [None] * size
    errors: list[BaseException] = []

    def run(g: ThreadGroup) -> None:
        try:
            results[g.rank] = fn(g)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)
            g.close()

    threads = [threading.Thread(target=run, args=(g,)) for g in ThreadGroup.make(size, timeout=timeout)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--first", type=int, default=0)
    p.add_argument("--last", type=int, default=STEPS)
    p.add_argument("--die-at", type=int)
    p.add_argument("--resume")
    p.add_argument("--save")
    p.add_argument("--bn", action="store_true", help="the model with batch norm, synchronized over the ranks")
    p.add_argument("--shard", action="store_true", help="the optimizer's state sharded over the ranks")
    args = p.parse_args()
    group = init(timeout=20)
    net = model(args.bn)
    with vmem.Trainer(net, group=group, sync_batch_norm=args.bn, shard_optimizer=args.shard) as trainer:
        if args.resume:
            trainer.load(args.resume)
        train(trainer, group.rank, group.size, args.first, args.last, args.die_at)
        if args.save:
            trainer.save(args.save)
        trainer.sync()
    np.savez(f"{args.out}.rank{group.rank}.npz", **net.params)


if __name__ == "__main__":
    main()
