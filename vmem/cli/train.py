"""``vmem train``: the cheap checks first, then a Trainer's fit; on several ranks through the launcher."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from typing import Any, TYPE_CHECKING

from ..errors import VmemError
from ..training.callbacks import StopOnSignal, Terminated
from ..units import format_bytes, printable
from .options import (
    AUTO_FRACTION,
    auto_fraction,
    check_dataset,
    check_memory,
    common,
    math_option,
    model,
    nonnegative_float,
    nonnegative_int,
    open_device,
    policy_spec,
    positive_float,
    positive_int,
    rebuild_for_classes,
)
from .plan import auto_memory, budget_line
from .progress import Slow, profile_line, stopped

if TYPE_CHECKING:
    from ..graph.network import Network
    from ..distributed.group import ProcessGroup

__all__ = ["TRAIN_DEFAULTS", "cmd_train", "add_parser"]


#: ``vmem train``'s defaults where a model has none of its own (``net.train_defaults``).
TRAIN_DEFAULTS = {"batch": 32, "epochs": 10, "optimizer": "sgd", "lr": 0.05}


def cmd_train(args: argparse.Namespace) -> int:
    from .. import distributed
    from ..training.checkpoint import SaveLock

    if args.nproc > 1 and not distributed.launched():
        _preflight(args, args.nproc)  # every cheap check before a rank is launched
        return _launch_ranks(args)
    on_gpu = args.device.startswith("cuda")
    group = distributed.init(nccl=on_gpu) if distributed.launched() else None
    if group is not None and args.device == "cuda":  # each rank its own GPU
        args.device = f"cuda:{group.rank}"
    if group is not None and group.rank != 0:  # rank 0 speaks for the run
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the life of this rank's process
    # a path that cannot take a checkpoint is refused before any training, and held for the run (by the
    # rank that writes it)
    lock = SaveLock(args.save) if args.save and (group is None or group.rank == 0) else contextlib.nullcontext()
    with lock, StopOnSignal(group) as stop:
        if group is None:
            return _train(args, stop, None)
        try:
            return int(distributed.abort_on_error(group, lambda: _train(args, stop, group)))
        except KeyboardInterrupt as exc:
            code = 143 if isinstance(exc, Terminated) else 130
            if not stop.agreed and group.size > 1:  # stopped outside training: the others may wait for this rank
                if group.rank == 0:
                    print(f"vmem train: {stopped(exc, args)}", file=sys.stderr, flush=True)
                group.comm.Abort(code)  # type: ignore[attr-defined]  # an MPIGroup (or NCCL over one)
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


def _preflight(args: argparse.Namespace, ranks: int) -> tuple[Any, Any, Any]:
    """What ``vmem train`` can check in a moment, before it profiles, plans or launches ranks: the model,
    options and their defaults, the dataset against the batch, the ranks against the batch and the cores,
    ``--memory`` against the device, the ``--resume`` checkpoint against the network and the run. (the
    network, the training and validation sets)."""
    from .. import data, distributed
    from ..threads import cores

    net = model(args)
    check_dataset(args, net)
    policy_spec(args)  # a contradiction between --policy and --algos, before anything runs
    for key, value in {**TRAIN_DEFAULTS, **getattr(net, "train_defaults", {})}.items():
        if getattr(args, key) is None:  # options left out: the model's own defaults, else the generic ones
            setattr(args, key, value)
    if ranks > 1 and args.batch % ranks:
        raise ValueError(
            f"--batch {args.batch} does not split into {ranks} equal shards, one a rank; give a multiple of {ranks}"
        )
    if ranks > 1 and not distributed.launched() and ranks > cores():
        raise ValueError(f"--nproc {ranks}: this machine has {cores()} cores for its ranks; give at most {cores()}")
    check_memory(args)
    train, val = data.load(args.dataset, input_shape=net.input_shape, seed=args.seed)
    if args.batch > len(train):
        raise ValueError(
            f"--batch {args.batch} is more than the {len(train)} training samples of {args.dataset}; give at most "
            f"{len(train)}"
        )
    if train.num_classes != net.output_shape()[-1]:
        net = rebuild_for_classes(args, train.num_classes, net)
    if args.resume:
        _check_resume(args, net)
    return net, train, val


def _optimizer(args: argparse.Namespace) -> Any:
    """The run's optimizer, as ``--optimizer``, ``--lr``, ``--momentum`` and ``--weight-decay`` ask."""
    from .. import optim

    if args.optimizer == "sgd":
        return optim.SGD(lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    return optim.Adam(lr=args.lr, weight_decay=args.weight_decay)


def _check_resume(args: argparse.Namespace, net: Network) -> None:
    """The ``--resume`` checkpoint, checked before any work: a readable vmem checkpoint of this
    network that has epochs left to train; every setting of this run that differs from its run named in
    one line; a different batch midway through an epoch refused unless ``--resume-anyway``."""
    from ..training import checkpoint

    meta = checkpoint.check(args.resume, net.name)
    # its arrays against this run's network (its image size, its classes) and optimizer, before any profiling
    checkpoint.read(args.resume, net.name, _optimizer(args), net.param_specs(net.input_shape))
    done = meta.get("epochs_done", 0)
    if isinstance(done, int) and done >= args.epochs:
        raise ValueError(
            f"--resume {args.resume}: it has trained {done} epochs already; ask for more with --epochs (now "
            f"{args.epochs})"
        )
    kept = checkpoint.settings(meta)
    now = {
        "math": args.math or kept.get("math"),  # the device's default where not asked for
        "precision": args.precision,
        "batch": args.batch,
        "seed": args.seed,
        "lr": args.lr,
        "policy": policy_spec(args),
    }
    differ = [k for k in now if k in kept and kept[k] != now[k]]
    if kept.get("precision") is None and meta.get("precision", "fp32") != args.precision:
        kept["precision"] = meta.get("precision", "fp32")
        differ.insert(0, "precision")
    if not differ:
        return
    what = ", ".join(f"{printable(str(k))} {printable(str(kept[k]))}" for k in differ)
    this = ", ".join(f"{k} {now[k]}" for k in differ)
    if "batch" in differ and meta.get("epoch_step", 0) and not args.resume_anyway:
        raise ValueError(
            f"--resume {args.resume}: it stopped midway through an epoch at batch {kept['batch']}; this run's batch "
            f"{args.batch} would draw other batches for the rest of it. Give --batch {kept['batch']}, or "
            "--resume-anyway"
        )
    print(
        f"vmem train: warning: --resume {args.resume} was trained with {what}; this run: {this}",
        file=sys.stderr,
        flush=True,
    )


def _train(args: argparse.Namespace, stop: Any, group: ProcessGroup | None = None) -> int:
    import numpy as np

    from ..training import Trainer

    ranks = 1 if group is None else group.size
    net, train, val = _preflight(args, ranks)
    local = argparse.Namespace(**{**vars(args), "batch": args.batch // ranks})  # what each rank runs
    fraction = auto_fraction(args.memory, policy_spec(args))
    memory: Any = args.memory
    needs = None
    raised = False
    if fraction is not None:  # a budget below what the baseline needs (at each rank's batch): what vmem is for
        memory, needs, raised = auto_memory(local, net, fraction)
    opt = _optimizer(args)
    t0 = time.perf_counter()
    # a math mode asked for: the device opened here with it (and closed after the Trainer)
    opened = (
        contextlib.nullcontext(args.device)
        if args.math is None
        else open_device(args.device, memory, **math_option(args))
    )
    with (
        opened as device,
        Trainer(
            net,
            device=device,
            memory=memory if args.math is None else None,
            policy=policy_spec(args),
            optimizer=opt,
            seed=args.seed,
            precision=args.precision,
            group=group,
            shard_optimizer=args.shard_optimizer,
        ) as trainer,
    ):
        if not args.json:
            print(
                f"training {net.name} on {args.dataset} ({len(train)} train / {len(val)} val), batch {args.batch}"
                + (f" on {ranks} ranks ({local.batch} each)" if ranks > 1 else "")
                + ", "
                f"policy {trainer.policy.spec}, device {trainer.device!r}",
                flush=True,
            )
            if needs is not None and fraction is not None:
                print(budget_line(memory, needs, fraction, raised, args), flush=True)
        from ..training import Checkpoint, CosineSchedule

        schedule = [CosineSchedule()] if args.schedule == "cosine" else []
        saver = Checkpoint(args.save) if args.save else None
        if trainer.profiling:  # measured once per program, device and machine, then kept (vmem.costs.cache)
            program = trainer.net.build(local.batch, trainer.input_shape, precision=args.precision)
            with Slow(
                f"profiling {len(program.ops)} layers of {net.name} at batch {local.batch} on "
                f"{trainer.device.name} (every pass and algorithm)",
                quiet=args.json,
            ):
                profiled_at = time.perf_counter()
                trainer.profile(local.batch)
            if not args.json:
                kept = trainer.session.kept.get(local.batch, False)
                print(profile_line(kept, time.perf_counter() - profiled_at), flush=True)
        initial = 0
        if args.resume:
            trainer.load(args.resume)
            initial = trainer.epochs_done
            if not args.json:
                print(
                    f"resuming {args.resume}: {initial} epochs and {trainer.epoch_step} steps of the next done "
                    f"({trainer.steps_done} steps)",
                    flush=True,
                )
        try:
            history = trainer.fit(
                train,
                epochs=args.epochs,
                val=val,
                batch_size=args.batch,
                progress=not args.json,
                callbacks=schedule + ([saver] if saver else []) + [stop],
                initial_epoch=initial,
            )
        except KeyboardInterrupt:
            # what the interrupted epoch did so far, on top of the last whole epoch; nothing where a second
            # signal cut a step short (its update may be partial: the last checkpoint stays)
            if args.save and not stop.cut:
                try:
                    trainer.save(args.save)
                    args.saved = True
                except VmemError as exc:
                    print(f"vmem train: {exc}", file=sys.stderr)
            raise
        planned = trainer.plans.get(local.batch)
        costs = trainer.costs.get(local.batch)
        notes = list(getattr(costs, "notes", []))
    wall = time.perf_counter() - t0
    last = history.last
    result = {
        "model": net.name,
        "dataset": args.dataset,
        "policy": policy_spec(args),
        "device": args.device,
        "memory": memory,
        "baseline_peak_bytes": needs,
        "batch": args.batch,
        "epochs": args.epochs,
        "seed": args.seed,
        "train_loss": last.train_loss,
        "val_loss": last.val_loss,
        "val_accuracy": last.val_accuracy,
        "step_seconds": float(np.median([e.step_seconds for e in history.epochs])),
        "peak_bytes": max(e.peak_bytes for e in history.epochs),
        "average_bytes": float(np.mean([e.average_bytes for e in history.epochs])),
        "offloaded_bytes": max(e.offloaded_bytes for e in history.epochs),
        "stall_seconds": float(np.mean([e.stall_seconds for e in history.epochs])),
        "wall_seconds": wall,
        "history": history.to_dict(),
        "chosen": planned.chosen if planned is not None else None,
        "reason": planned.reason if planned else None,
        "profile_notes": notes,
        "profile_kept": trainer.session.kept.get(local.batch) if trainer.profiling else None,
        "save_failed": saver.failed if saver else None,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"done in {wall:.1f} s: val accuracy {last.val_accuracy:.2%}, train loss {last.train_loss:.4f}, "
            f"step time {result['step_seconds'] * 1e3:.1f} ms (median), peak device memory "
            f"{format_bytes(result['peak_bytes'])} (average {format_bytes(result['average_bytes'])})"
        )
        if needs is not None:
            print(
                f"used {format_bytes(result['peak_bytes'])} of device memory at the peak: "
                f"{result['peak_bytes'] / needs:.2f}x the {format_bytes(needs)} the baseline policy needs"
            )
        if result["offloaded_bytes"]:
            print(
                f"offloaded {format_bytes(result['offloaded_bytes'])} a step to pinned host memory; "
                f"compute waited {result['stall_seconds'] * 1e3:.1f} ms a step for the memory stream"
            )
        if planned is not None and planned.chosen:
            print(planned.reason)
        for note in notes:
            print(f"profile: {note}")
    if saver is not None and saver.failed:
        print(f"vmem train: the last save failed: {saver.failed}", file=sys.stderr)
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
        choices=("digits", "synthetic", "reverse"),
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
