"""``vmem train``: the cheap checks first, then a Trainer's fit; on several ranks through the launcher."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
from typing import Any, TYPE_CHECKING

from ..training.callbacks import StopOnSignal, Terminated
from ..training.run import DATASETS, TRAIN_DEFAULTS, RunConfig, prepare, run
from .options import (
    AUTO_FRACTION,
    common,
    nonnegative_float,
    nonnegative_int,
    policy_spec,
    positive_float,
    positive_int,
)
from .progress import Slow, stopped

if TYPE_CHECKING:
    from ..distributed.group import ProcessGroup

__all__ = ["TRAIN_DEFAULTS", "cmd_train", "add_parser"]


def _config(args: argparse.Namespace) -> RunConfig:
    """The run the parsed options ask for (``--algos`` folded into the policy)."""
    return RunConfig(
        model=None if args.onnx else args.model,
        onnx=args.onnx,
        image_size=args.image_size,
        depth=args.depth,
        dataset=args.dataset,
        batch=args.batch,
        epochs=args.epochs,
        optimizer=args.optimizer,
        lr=args.lr,
        momentum=args.momentum,
        weight_decay=args.weight_decay,
        schedule=args.schedule,
        seed=args.seed,
        policy=policy_spec(args),
        memory=args.memory,
        device=args.device,
        math=args.math,
        precision=args.precision,
        save=args.save,
        resume=args.resume,
        resume_anyway=args.resume_anyway,
        shard_optimizer=args.shard_optimizer,
        nproc=args.nproc,
    )


def cmd_train(args: argparse.Namespace) -> int:
    from .. import distributed
    from ..training.checkpoint import SaveLock

    config = _config(args)
    if args.nproc > 1 and not distributed.launched():
        prepare(config, args.nproc)  # every cheap check before a rank is launched
        return _launch_ranks(args)
    group = distributed.init(nccl=config.device.startswith("cuda")) if distributed.launched() else None
    if group is not None and config.device == "cuda":  # each rank its own GPU
        config = dataclasses.replace(config, device=f"cuda:{group.rank}")
    if group is not None and group.rank != 0:  # rank 0 speaks for the run
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the life of this rank's process
    # a path that cannot take a checkpoint is refused before any training, and held for the run (by the
    # rank that writes it)
    lock = SaveLock(args.save) if args.save and (group is None or group.rank == 0) else contextlib.nullcontext()
    with lock, StopOnSignal(group) as stop:
        try:
            if group is None:
                return _train(args, config, stop, None)
            return int(distributed.abort_on_error(group, lambda: _train(args, config, stop, group)))
        except KeyboardInterrupt as exc:
            args.saved = stop.saved
            if group is None:
                raise
            code = 143 if isinstance(exc, Terminated) else 130
            if not stop.agreed and group.size > 1:  # stopped outside training: the others may wait for this rank
                if group.rank == 0:
                    print(f"vmem train: {stopped(exc, args)}", file=sys.stderr, flush=True)
                distributed.abort(group, code)
            if group.rank == 0:  # every rank stopped after the same step; rank 0 says so
                raise
            return code


def _launch_ranks(args: argparse.Namespace) -> int:
    """``vmem train --nproc N``: the same command on N ranks (see :mod:`vmem.distributed.launch`)."""
    from ..distributed import launch
    from ..threads import cores

    argv, skip = [], False
    for a in args.argv:
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            argv.append(a)
    return launch.launch(argv, args.nproc, max(1, cores() // args.nproc))


def _train(args: argparse.Namespace, config: RunConfig, stop: StopOnSignal, group: ProcessGroup | None) -> int:
    """The run carried out (:func:`vmem.training.run`), its result printed: as text, or ``--json``."""

    def say(line: str) -> None:
        print(line, flush=True)

    result = run(
        config,
        group=group,
        stop=stop,
        progress=None if args.json else say,
        slow=lambda what: Slow(what, quiet=args.json),
    )
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print("\n".join(result.lines()))
    if result.save_failed:
        print(f"vmem train: the last save failed: {result.save_failed}", file=sys.stderr)
        return 1
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("train", help="train a model on a dataset", description="Train a zoo model with vmem.Trainer.")
    common(
        p,
        "digits_vgg",
        policy_default="auto",
        memory_help=(
            "device memory, e.g. 256MiB, or auto[:FRACTION]: that fraction of what the baseline policy would need "
            f"(default auto:{AUTO_FRACTION:g} with the policies auto and vdnn-dyn, 1GiB with any other)"
        ),
    )
    p.add_argument(
        "--dataset",
        default="digits",
        choices=DATASETS,
        help="default digits; reverse: token sequences for nmt_small",
    )
    p.add_argument("--batch", type=positive_int, help="batch size (default 32; the model's own for nmt_small: 64)")
    p.add_argument(
        "--nproc",
        type=positive_int,
        default=1,
        help="train data-parallel on N processes (MPI; pip install 'vmem[mpi]'; on GPUs, --device cuda: rank r on "
        "cuda:r, gradients summed by NCCL): each takes 1/N of every batch, gradients summed over them during "
        "backward; rank 0 prints and writes checkpoints (default 1)",
    )
    p.add_argument(
        "--shard-optimizer",
        action="store_true",
        help="with --nproc: each rank keeps the optimizer state of 1/N of the parameters (ZeRO stage 1)",
    )
    p.add_argument("--epochs", type=positive_int, help="epochs (default 10; nmt_small: 3)")
    p.add_argument("--optimizer", choices=("sgd", "adam"), help="default sgd; nmt_small: adam")
    p.add_argument("--lr", type=positive_float, help="learning rate (default 0.05; nmt_small with adam: 0.01)")
    p.add_argument(
        "--schedule",
        choices=("cosine", "constant"),
        default="cosine",
        help="learning rate over the epochs: cosine decay to 0 (default) or constant",
    )
    p.add_argument("--momentum", type=nonnegative_float, default=0.9, help="SGD momentum (default 0.9)")
    p.add_argument("--weight-decay", type=nonnegative_float, default=0.0)
    p.add_argument(
        "--seed",
        type=nonnegative_int,
        default=0,
        help="seeds the weights, shuffling and dropout (default 0; the same seed gives the same weights)",
    )
    p.add_argument(
        "--save",
        metavar="PATH",
        help="write a checkpoint (.npz) after every epoch (checked before "
        "training starts); on Ctrl-C or SIGTERM, what was trained so far (after the step running)",
    )
    p.add_argument(
        "--resume",
        metavar="PATH",
        help="go on from a checkpoint of the same command (its epochs and "
        "steps, weights, optimizer state and random state): ends with the weights of a run never stopped",
    )
    p.add_argument(
        "--resume-anyway",
        action="store_true",
        help="with --resume: go on even with another batch midway through an epoch (other settings that "
        "differ from the checkpoint's are named and allowed)",
    )
    p.set_defaults(func=cmd_train)
