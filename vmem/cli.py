"""The ``vmem`` command: train, plan, list models and devices. Every command has ``--help`` and ``--json``."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import warnings
from typing import Any, Sequence

from .errors import VmemError
from .training.callbacks import StopOnSignal, Terminated
from .cli_args import (
    check_dataset as _check_dataset,
    model as _model,
    nonnegative_float as _nonnegative_float,
    nonnegative_int as _nonnegative_int,
    policy_spec as _policy_spec,
    positive_float as _positive_float,
    positive_int as _positive_int,
    rebuild_for_classes as _rebuild_for_classes,
)
from .cli_tools import cmd_bench, cmd_trace
from .units import format_bytes, printable

__all__ = ["main"]


#: ``vmem train --memory auto``: the device budget as a fraction of the baseline policy's peak
AUTO_FRACTION = 0.5


def _auto_fraction(memory: str | None, policy: str) -> float | None:
    """The fraction of the baseline's peak ``--memory`` asks for (None: a size, or the 1GiB default)."""
    if memory is None:
        return AUTO_FRACTION if policy.split(":")[0] in ("auto", "vdnn-dyn") else None
    if memory != "auto" and not memory.startswith("auto:"):
        return None
    text = memory.partition(":")[2] or str(AUTO_FRACTION)
    try:
        fraction = float(text)
    except ValueError:
        fraction = -1.0
    if not 0 < fraction <= 1:
        raise ValueError(f"--memory {memory}: auto takes a fraction of the baseline's peak in (0, 1], e.g. auto:0.5")
    return fraction


#: ``vmem train``'s defaults where a model has none of its own (``net.train_defaults``).
TRAIN_DEFAULTS = {"batch": 32, "epochs": 10, "optimizer": "sgd", "lr": 0.05}


def cmd_train(args: argparse.Namespace) -> int:
    from . import distributed
    from .training.checkpoint import SaveLock

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
                    print(f"vmem train: {_stopped(exc, args)}", file=sys.stderr, flush=True)
                group.comm.Abort(code)
            if group.rank == 0:  # every rank stopped after the same step; rank 0 says so
                raise
            return code


def _launch_ranks(args: argparse.Namespace) -> int:
    """``vmem train --nproc N``: the same command on N ranks (see :mod:`vmem.distributed.launch`)."""
    from .distributed import launch
    from .threads import cores

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
    from . import data, distributed
    from .threads import cores

    net = _model(args)
    _check_dataset(args, net)
    _policy_spec(args)  # a contradiction between --policy and --algos, before anything runs
    for key, value in {**TRAIN_DEFAULTS, **getattr(net, "train_defaults", {})}.items():
        if getattr(args, key) is None:  # options left out: the model's own defaults, else the generic ones
            setattr(args, key, value)
    if ranks > 1 and args.batch % ranks:
        raise ValueError(
            f"--batch {args.batch} does not split into {ranks} equal shards, one a rank; give a multiple of {ranks}"
        )
    if ranks > 1 and not distributed.launched() and ranks > cores():
        raise ValueError(f"--nproc {ranks}: this machine has {cores()} cores for its ranks; give at most {cores()}")
    _check_memory(args)
    train, val = data.load(args.dataset, input_shape=net.input_shape, seed=args.seed)
    if args.batch > len(train):
        raise ValueError(
            f"--batch {args.batch} is more than the {len(train)} training samples of {args.dataset}; give at most "
            f"{len(train)}"
        )
    if train.num_classes != net.output_shape()[-1]:
        net = _rebuild_for_classes(args, train.num_classes, net)
    if args.resume:
        _check_resume(args, net)
    return net, train, val


def _check_memory(args: argparse.Namespace) -> None:
    """``--memory`` (a size) within what the device has: a simulated GPU's capacity (unless
    ``--oversubscribe``: a what-if card), the CPU device's host memory."""
    from .units import parse_bytes

    name = args.device
    if args.memory is None or args.memory == "auto" or str(args.memory).startswith("auto:"):
        return
    wanted = parse_bytes(args.memory, name="--memory")
    if name.startswith("sim:"):
        from .device import specs as gpu_specs

        capacity = gpu_specs.get(name[4:]).memory
        if wanted > capacity and not getattr(args, "oversubscribe", False):
            raise ValueError(
                f"--memory {args.memory} is more than {name}'s {format_bytes(capacity)}; give at most that, or "
                "--oversubscribe to plan a card with that much memory"
            )
        if wanted > _MOST_MEMORY:
            raise ValueError(f"--memory {args.memory}: more than the {format_bytes(_MOST_MEMORY)} a plan can take")
    elif name in ("cpu", "cpu:0"):
        ram = _host_memory()
        if ram is not None and wanted > ram:
            raise ValueError(
                f"--memory {args.memory} is more than this machine's {format_bytes(ram)} of memory (the CPU device's "
                "arena is host memory); give less"
            )


#: The most memory a plan of an oversubscribed simulated GPU takes (the planner's own bound).
_MOST_MEMORY = 1 << 60


def _host_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _check_resume(args: argparse.Namespace, net: Any) -> None:
    """The ``--resume`` checkpoint, checked before any work: a readable vmem checkpoint of this
    network that has epochs left to train; every setting of this run that differs from its run named in
    one line; a different batch midway through an epoch refused unless ``--resume-anyway``."""
    from .training import checkpoint

    meta = checkpoint.check(args.resume, net.name)
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
        "policy": _policy_spec(args),
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


def _train(args: argparse.Namespace, stop: Any, group: Any = None) -> int:
    import numpy as np

    from . import optim
    from .training import Trainer

    ranks = 1 if group is None else group.size
    net, train, val = _preflight(args, ranks)
    local = argparse.Namespace(**{**vars(args), "batch": args.batch // ranks})  # what each rank runs
    fraction = _auto_fraction(args.memory, _policy_spec(args))
    memory: Any = args.memory
    needs = None
    raised = False
    if fraction is not None:  # a budget below what the baseline needs (at each rank's batch): what vmem is for
        memory, needs, raised = _auto_memory(local, net, fraction)
    if args.optimizer == "sgd":
        opt = optim.SGD(lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    else:
        opt = optim.Adam(lr=args.lr, weight_decay=args.weight_decay)
    t0 = time.perf_counter()
    # a math mode asked for: the device opened here with it (and closed after the Trainer)
    opened = (
        contextlib.nullcontext(args.device) if args.math is None else _open_device(args.device, memory, **_math(args))
    )
    with (
        opened as device,
        Trainer(
            net,
            device=device,
            memory=memory if args.math is None else None,
            policy=_policy_spec(args),
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
            if needs is not None:
                print(_budget_line(memory, needs, fraction, raised, args), flush=True)
        from .training import Checkpoint, CosineSchedule

        schedule = [CosineSchedule()] if args.schedule == "cosine" else []
        saver = Checkpoint(args.save) if args.save else None
        if trainer.profiling:  # measured once per program, device and machine, then kept (vmem.costs.cache)
            program = trainer.net.build(local.batch, trainer.input_shape, precision=args.precision)
            with _Slow(
                f"profiling {len(program.ops)} layers of {net.name} at batch {local.batch} on "
                f"{trainer.device.name} (every pass and algorithm; kept for the next run)",
                quiet=args.json,
            ):
                profiled_at = time.perf_counter()
                trainer.profile(local.batch)
            if not args.json:
                kept = trainer.session.kept.get(local.batch, False)
                print(_profile_line(kept, time.perf_counter() - profiled_at), flush=True)
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
        "policy": _policy_spec(args),
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


def _profile_line(kept: bool, seconds: float) -> str:
    """Whether the run's profile came from the cache or was measured (and kept) now."""
    from .costs import cache

    where = printable(str(cache.folder()))
    if not cache.enabled():
        return f"profile: measured in {seconds:.1f} s (VMEM_PROFILE_CACHE=0: not kept)"
    if kept:
        return f"profile: the one kept in {where} (VMEM_PROFILE_CACHE=0 measures afresh)"
    return f"profile: measured in {seconds:.1f} s and kept in {where} for the next run"


#: Seconds after which a command that is still working says so on stderr.
SLOW_AFTER = 2.0


class _Slow:
    """Says on stderr what is running if it is still running after ``after`` seconds, and then how long it
    took (a plan of a large network can take a while: a user should not face a silent terminal)."""

    def __init__(self, what: str, after: float | None = None, quiet: bool = False):
        import threading

        after = SLOW_AFTER if after is None else after
        self.what, self.t0, self.said = what, time.perf_counter(), False
        self._timer = None if quiet else threading.Timer(after, self._say)
        if self._timer is not None:
            self._timer.name = "vmem-cli-progress"
            self._timer.daemon = True
            self._timer.start()

    def _say(self) -> None:
        self.said = True
        print(f"{self.what}...", file=sys.stderr, flush=True)

    def __enter__(self) -> "_Slow":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer.join()
        if self.said and exc[0] is None:
            print(f"done in {time.perf_counter() - self.t0:.1f} s", file=sys.stderr, flush=True)


def _math(args: argparse.Namespace) -> dict[str, str]:
    """The device option ``--math`` asks for (none where it is left to the device's default)."""
    return {"math": args.math} if args.math else {}


def _open_device(name: str, memory: Any = None, **options: Any) -> Any:
    """The device ``name`` with ``memory`` (its default capacity where None) and ``options``."""
    from .device import device as make_device

    return make_device(name, **({"memory": memory} if memory is not None else {}), **options)


#: The arena of a CUDA device opened only to read its catalog and spec: planning needs no GPU memory.
_PLANNING_ARENA = 1 << 20


def _auto_memory(args: argparse.Namespace, net: Any, fraction: float, device: Any = None) -> tuple[int, int, bool]:
    """``--memory auto:FRACTION``: (the budget, the baseline's peak, whether the budget had to be raised).

    The budget is that fraction of the baseline policy's peak (with the least-workspace algorithms: the
    least it needs), rounded up to KiB, with the device's own
    algorithms (on a GPU, cuDNN's: the device is opened with a tiny arena to read them); never below the
    smallest budget the run's policy trains in, where it is raised to that. ``device``: one already open
    for planning (else it is opened here)."""
    from .planner import UNBOUNDED, plan, smallest_memory, spec_of

    policy = _policy_spec(args)
    if device is not None:
        opened = contextlib.nullcontext(device)
    elif args.device.startswith("cuda"):
        opened = _open_device(args.device, _PLANNING_ARENA)
    else:
        opened = contextlib.nullcontext(args.device)
    with opened as planning:
        needs = plan(
            net, args.batch, device=planning, policy="baseline:algos=memory", memory=UNBOUNDED, precision=args.precision
        ).peak_bytes
        spec, alignment, catalog = spec_of(planning)
        floor = smallest_memory(
            net.build(args.batch, precision=args.precision), spec, policy, alignment=alignment, catalog=catalog
        )
    memory = -(-int(needs * fraction) // 1024) * 1024
    if floor is not None and memory < floor:
        return floor, needs, True
    return memory, needs, False


def _budget_line(memory: int, needs: int, fraction: float, raised: bool, args: argparse.Namespace) -> str:
    if raised:
        return (
            f"device memory {format_bytes(memory)}: the smallest budget {_policy_spec(args)} trains in at batch "
            f"{args.batch}, above the {fraction:.0%} of the {format_bytes(needs)} the baseline policy needs that "
            f"--memory auto:{fraction:g} asks for"
        )
    return (
        f"device memory {format_bytes(memory)}: {fraction:.0%} of the {format_bytes(needs)} the baseline policy "
        f"needs (--memory auto:{fraction:g})"
    )


def cmd_plan(args: argparse.Namespace) -> int:
    from . import policies
    from .planner import plan

    net = _model(args)
    _check_memory(args)
    if args.largest_batch:
        return _largest_batch(args, net)
    if args.batch is None:
        raise ValueError("--batch is required (or --largest-batch: the largest batch that fits)")
    simulated = args.device.startswith("sim:")
    if args.policy is None and args.memory is not None and not simulated and not args.profile:
        args.policy = "baseline"  # auto would profile the device first: only when asked (--profile)
    fraction = _auto_fraction(args.memory, "") if args.memory is not None else None
    memory: Any = args.memory
    needs = None
    raised = False
    # a CUDA device planned on without a profile is opened once, with a tiny arena, for the budget and the plan
    planning = (
        _open_device(args.device, _PLANNING_ARENA, **_math(args))
        if args.device.startswith("cuda") and not args.profile
        else None
    )
    if fraction is not None:
        memory, needs, raised = _auto_memory(args, net, fraction, planning)
    costs, notes = None, []
    policy = _policy_spec(args)
    say = (lambda text: None) if args.json else (lambda text: print(text, file=sys.stderr, flush=True))
    if needs is not None:
        say(_budget_line(memory, needs, fraction, raised, args))
    if not simulated and not args.profile and policies.get(policy).needs_profile:
        say(f"{policy} decides by measured time: profiling first (as --profile does)")
        if planning is not None:
            planning.close()
            planning = None
        args.profile = True
    if simulated:
        device: Any = args.device if args.math is None else _open_device(args.device, **_math(args))
        if args.profile:
            say(f"--profile: {args.device} is simulated; its times come from the roofline model")
    elif args.profile:  # measure on the device itself, within the budget the plan is for
        from .costs import cache

        device = _open_device(args.device, memory, **_math(args))
        memory = device.pool.capacity
        program = device.catalog(net.build(args.batch, precision=args.precision))
        say(
            f"profiling {len(program.ops)} layers of {net.name} at batch {args.batch} on {device.name} (every pass "
            f"and algorithm, in its {format_bytes(device.pool.capacity)})..."
        )
        t0 = time.perf_counter()
        costs, kept = cache.profile(program, copy_gbps=device.spec.pcie_gbps, device=device)
        notes = costs.notes
        say(
            (
                f"the profile kept in {printable(str(cache.folder()))} (VMEM_PROFILE_CACHE=0 measures afresh)"
                if kept
                else f"profiled in {time.perf_counter() - t0:.1f} s"
            )
            + "".join(f"\n  {n}" for n in notes)
        )
    elif planning is not None:  # its algorithms and spec, without taking its memory
        device = planning
        memory = memory if memory is not None else device.free_capacity
    else:
        device = args.device
    try:
        with _Slow(f"planning {net.name} at batch {args.batch} under {policy} on {args.device}", quiet=args.json):
            result = plan(
                net,
                args.batch,
                device,
                policy,
                memory=memory,
                costs=costs,
                precision=args.precision,
                nproc=args.nproc,
                shard_optimizer=args.shard_optimizer,
            )
    finally:
        if not isinstance(device, str):
            device.close()
    out = result.to_dict()
    out.update(model=net.name, memory=memory, baseline_peak_bytes=needs, profile_notes=notes)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(result.table())
        line = f"fits: {'yes' if result.fits else 'NO'}; offloaded {format_bytes(result.offloaded_bytes)} a step"
        if result.step_seconds is not None:
            line += (
                f"; predicted step {result.step_seconds * 1e3:.1f} ms (baseline with the fastest algorithms: "
                f"{result.baseline_step_seconds * 1e3:.1f} ms), stalls {result.stall_seconds * 1e3:.1f} ms"
            )
        print(line)
        if args.nproc > 1 and result.comm_seconds is not None:
            print(
                f"data-parallel on {args.nproc} ranks (batch {args.batch} each): communication "
                f"{result.comm_seconds * 1e3:.2f} ms a step (the gradients' all-reduce beside backward"
                + (", the updated weights' broadcast after the update" if args.shard_optimizer else "")
                + f"), {result.exposed_comm_seconds * 1e3:.2f} ms of it exposed"
            )
        if result.reason:
            print(result.reason)
    return 0 if result.fits else 1  # a plan that does not fit is a failure, as vdnn-dyn's refusal is


def _largest_batch(args: argparse.Namespace, net: Any) -> int:
    """``vmem plan --largest-batch``: the largest batch ``--policy`` (auto by default) plans to fit."""
    from .planner import largest_batch

    if args.memory is not None and str(args.memory).startswith("auto"):
        raise ValueError("--largest-batch takes --memory as a size (e.g. 8GiB), not auto")
    policy = args.policy or "auto"
    if args.algos:
        policy = _policy_spec(args)
    device: Any = args.device
    if args.device.startswith("cuda"):  # its catalog and spec, without taking its memory
        device = _open_device(args.device, _PLANNING_ARENA, **_math(args))
    tries: list[tuple[int, bool]] = []
    try:
        with _Slow(f"searching the largest batch of {net.name} under {policy} on {args.device}", quiet=args.json):
            found = largest_batch(
                net,
                device,
                memory=args.memory,
                policy=policy,
                precision=args.precision,
                most=args.batch or 1 << 16,
                progress=lambda b, ok: tries.append((b, ok)),
            )
    finally:
        if not isinstance(device, str):
            device.close()
    memory = args.memory or "the device's memory"
    if args.json:
        print(
            json.dumps(
                {
                    "model": net.name,
                    "device": args.device,
                    "policy": policy,
                    "memory": args.memory,
                    "precision": args.precision,
                    "largest_batch": found,
                    "tries": tries,
                },
                indent=2,
            )
        )
    else:
        print(
            f"largest batch of {net.name} under {policy} in {memory} on {args.device} ({args.precision}): {found}"
            + ("" if found else " (not even batch 1 fits)")
        )
    return 0 if found else 1


def cmd_models(args: argparse.Namespace) -> int:
    from . import models

    rows = []
    with _Slow(f"building the {len(models.names())} models of the zoo to count their parameters", quiet=args.json):
        for name in models.names():
            net = models.get(name)
            rows.append(
                {
                    "name": name,
                    "input_shape": list(net.input_shape),
                    "params": net.num_params(),
                    "description": models.info(name),
                }
            )
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        width = max(len(r["name"]) for r in rows)
        for r in rows:
            shape = "x".join(map(str, r["input_shape"]))
            print(f"{r['name']:<{width}}  {shape:>11}  {r['params'] / 1e6:8.2f}M params  {r['description']}")
    return 0


def cmd_devices(args: argparse.Namespace) -> int:
    from .device import specs as gpu_specs
    from .device.cuda import nvml

    rows: list[dict[str, Any]] = [{"name": "cpu", "kind": "cpu"}]
    for gpu in nvml.gpus():  # through NVML alone: listing GPUs imports no CuPy
        index = gpu["cuda_index"]
        rows.append(
            {"name": f"cuda:{index}" if index is not None else f"nvml:{gpu['nvml_index']}", "kind": "cuda", **gpu}
        )
    rows += [{**gpu_specs.get(n).to_dict(), "name": f"sim:{n}", "kind": "sim"} for n in gpu_specs.names()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print("cpu  (the default: real numerics; memory= sets its capacity, pcie_gbps= throttles copies)")
    cuda = [r for r in rows if r["kind"] == "cuda"]
    if not cuda:
        print(f"cuda: none here: {nvml.why_not() or 'NVML lists no GPU'}")
    for r in sorted(cuda, key=lambda r: (r["cuda_index"] is None, r["cuda_index"] or 0, r["nvml_index"])):
        link = f", PCIe gen {r['pcie_gen']} x{r['pcie_width']}" if "pcie_gen" in r else ""
        print(
            f"{r['name']:<16} {format_bytes(r['total_bytes']):>11}  {r['gpu']} at {r['pci_bus_id']}: "
            f"{format_bytes(r['used_bytes'])} in use{link}"
        )
    if any(r["cuda_index"] is None for r in cuda):
        print(
            "  nvml:N: CUDA hides it (CUDA_VISIBLE_DEVICES), or numbers these different GPUs fastest first; "
            "set CUDA_DEVICE_ORDER=PCI_BUS_ID for cuda:N in this order"
        )
    for r in rows:
        if r["kind"] == "sim":
            print(
                f"{r['name']:<16} {format_bytes(r['memory']):>11}  {r['fp32_tflops']:5.1f} TFLOP/s  "
                f"{r['memory_gbps']:6.0f} GB/s  host link {r['h2d_gbps']:g} GB/s  (simulated: plans only)"
            )
    return 0


def _common(
    p: argparse.ArgumentParser,
    model_default: str | None,
    policy_default: str | None = None,
    policy_help: str = "auto where --memory is given, else baseline",
    memory_help: str = "device memory, e.g. 256MiB or 12GB (default 1GiB)",
    simulated: bool = False,
) -> None:
    """Options every command that builds a model takes."""
    which = p.add_mutually_exclusive_group(required=model_default is None)
    which.add_argument(
        "--model",
        default=model_default,
        help="zoo model name (see `vmem models`)" + (f"; default {model_default}" if model_default else ""),
    )
    which.add_argument(
        "--onnx",
        metavar="PATH",
        help="an ONNX model to import instead (one image input, one output; needs vmem[onnx])",
    )
    p.add_argument(
        "--image-size",
        type=_positive_int,
        help="input height and width (default: the model's; an ONNX model's where it leaves them open)",
    )
    p.add_argument("--depth", type=_positive_int, help="depth, for resnet_cifar")
    p.add_argument(
        "--device",
        default="cpu",
        help="device name: cpu (default), cuda:N"
        + (" or sim:<gpu> (a simulated GPU: plans only)" if simulated else "")
        + " (see vmem devices)",
    )
    p.add_argument("--memory", default=None, help=memory_help)
    p.add_argument(
        "--policy",
        default=policy_default,
        help="policy spec: baseline, layerwise, vdnn-all, vdnn-conv, vdnn-dyn, gist, mirror, chen, echo, auto (all of "
        "them mixed for the budget), with :key=value options (default " + (policy_default or policy_help) + ")",
    )
    p.add_argument(
        "--algos",
        choices=("fit", "memory", "performance"),
        help="convolution algorithms: the fastest with which the plan fits (fit, the default), the leanest or the fastest (adds algos= to --policy)",
    )
    p.add_argument(
        "--precision",
        choices=("fp32", "fp16", "bf16"),
        default="fp32",
        help="what feature maps are stored in (default fp32); fp16 and bf16 keep weights, their gradients and "
        "the optimizer's state in fp32 and fp16 scales its loss (bf16 needs ml_dtypes: vmem[bf16])",
    )
    p.add_argument(
        "--math",
        choices=("tf32", "exact"),
        help="how FP32 convolutions compute on a GPU: tf32 (the CUDA device's default, as PyTorch's) or exact "
        "(FMA; the CPU device computes exact only)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def _add_train(sub: Any) -> None:
    p = sub.add_parser("train", help="train a model on a dataset", description="Train a zoo model with vmem.Trainer.")
    _common(
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
    p.add_argument("--batch", type=_positive_int, help="batch size (default 32; the model's own for nmt_small: 64)")
    p.add_argument(
        "--nproc",
        type=_positive_int,
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
    p.add_argument("--epochs", type=_positive_int, help="epochs (default 10; nmt_small: 3)")
    p.add_argument("--optimizer", choices=("sgd", "adam"), help="default sgd; nmt_small: adam")
    p.add_argument("--lr", type=_positive_float, help="learning rate (default 0.05; nmt_small with adam: 0.01)")
    p.add_argument(
        "--schedule",
        choices=("cosine", "constant"),
        default="cosine",
        help="learning rate over the epochs: cosine decay to 0 (default) or constant",
    )
    p.add_argument("--momentum", type=_nonnegative_float, default=0.9, help="SGD momentum (default 0.9)")
    p.add_argument("--weight-decay", type=_nonnegative_float, default=0.0)
    p.add_argument(
        "--seed",
        type=_nonnegative_int,
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


def _add_plan(sub: Any) -> None:
    p = sub.add_parser(
        "plan",
        help="plan a training step without running it",
        description="Replay one step's allocations under a policy and print the plan. Exits 1 if "
        "the plan does not fit the device's memory.",
    )
    _common(
        p,
        None,
        memory_help="device memory, e.g. 256MiB or 12GB, or auto[:FRACTION]: that fraction of what "
        "the baseline policy needs on this device (default: the device's capacity; the CPU's 1GiB)",
        simulated=True,
        policy_help="auto where --memory is given on a simulated GPU or with --profile, else baseline",
    )
    p.add_argument(
        "--batch",
        type=_positive_int,
        help="the batch of one rank (with --nproc); required, except with --largest-batch (then the most tried)",
    )
    p.add_argument(
        "--largest-batch",
        action="store_true",
        help="print the largest batch the policy plans to fit in --memory (plans only: nothing runs)",
    )
    p.add_argument(
        "--nproc",
        type=_positive_int,
        default=1,
        help="one rank of a data-parallel run of N (each at --batch): the gradients' all-reduce over the "
        "device's interconnect priced beside backward (default 1)",
    )
    p.add_argument(
        "--shard-optimizer",
        action="store_true",
        help="with --nproc: the optimizer state sharded over the ranks (ZeRO stage 1), the largest share planned",
    )
    p.add_argument(
        "--oversubscribe",
        action="store_true",
        help="allow --memory above a simulated GPU's capacity (plan a what-if card with that much memory)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="on a real device (cpu, cuda:N): measure every layer there first, within --memory, so that "
        "the plan predicts time (auto and vdnn-dyn need it: they profile without it too)",
    )
    p.set_defaults(func=cmd_plan)


def _add_trace(sub: Any) -> None:
    p = sub.add_parser(
        "trace",
        help="run a few steps; write a Chrome trace, a memory plot, a layer table",
        description="Train a few steps and write the last step's timeline: trace.json (open in "
        "Perfetto or chrome://tracing), memory.png and layers.txt, into --out.",
    )
    _common(p, "vgg_cifar")
    p.add_argument("--dataset", default="synthetic", choices=("digits", "synthetic", "reverse"))
    p.add_argument("--batch", type=_positive_int, default=64)
    p.add_argument("--steps", type=_positive_int, default=3, help="steps to run; the last is written (default 3)")
    p.add_argument(
        "--pcie-gbps",
        type=_positive_float,
        help="throttle host-device copies to this many GB/s (more than 0; leave it out for an unthrottled link)",
    )
    p.add_argument("--seed", type=_nonnegative_int, default=0)
    p.add_argument("--out", default="vmem-trace", help="output folder (default vmem-trace)")
    p.set_defaults(func=cmd_trace)


def _add_bench(sub: Any) -> None:
    p = sub.add_parser(
        "bench",
        help="microbenchmarks (bandwidth)",
        description="bandwidth: device-to-host and host-to-device copy throughput over sizes, "
        "pinned against pageable host buffers; with --codec, the effective bandwidth of offloads "
        "and prefetches through a codec on ReLU-like activations of several densities.",
    )
    p.add_argument("which", choices=("bandwidth",))
    p.add_argument("--device", default="cpu")
    p.add_argument("--memory", default=None, help="device memory (default 1GiB)")
    p.add_argument(
        "--pcie-gbps",
        type=_positive_float,
        help="throttle the CPU device's link to this many GB/s (more than 0; leave it out for an unthrottled link)",
    )
    p.add_argument("--sizes", help="comma-separated sizes (default 64KiB to 256MiB)")
    p.add_argument("--rounds", type=_positive_int, default=3)
    p.add_argument("--codec", help="transfer through this codec (zvc, ssdc, fp16, fp8, ...; see vmem.codecs)")
    p.add_argument(
        "--density",
        default="0.1,0.3,0.5,0.7,0.9",
        help="with --codec: fractions of nonzeros, comma-separated (default 0.1,...,0.9)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_bench)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vmem", description="Train deep networks in a GPU memory budget.")
    parser.add_argument("--version", action="version", version=f"vmem {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in (_add_train, _add_plan, _add_trace, _add_bench):
        add(sub)
    p = sub.add_parser("models", help="list the model zoo")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_models)

    # listed for --help; main() hands `vmem check ...` to vmem.selfcheck, which parses its own options
    sub.add_parser("check", help="check this installation (modules, package files, kernels), GPU or not")

    p = sub.add_parser("devices", help="list devices")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_devices)
    return parser


def _version() -> str:
    from . import __version__

    return __version__


@contextlib.contextmanager
def _warnings_as_lines(command: str) -> Any:
    """Warnings printed while a command runs read as one line of the command's (``vmem train: warning:
    ...``), not as a source file's line and location."""
    before = warnings.formatwarning

    def line(message: Any, category: Any, filename: str, lineno: int, text: str | None = None) -> str:
        return f"vmem {command}: warning: {message}\n"

    warnings.formatwarning = line
    try:
        yield
    finally:
        warnings.formatwarning = before


def _stopped(exc: BaseException, args: argparse.Namespace) -> str:
    """The one line a command stopped by a signal ends with: which signal, and what was saved."""
    what = "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"
    save = getattr(args, "save", None)
    if not save:
        return what
    if args.saved:
        return f"{what}; what was trained so far is saved in {save}"
    if os.path.isfile(save):
        return f"{what}; the last checkpoint in {save} is kept"
    return f"{what} before anything was trained; nothing saved"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["check"]:
        from . import selfcheck

        return selfcheck.main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = argv
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    args.saved = False
    try:
        # Ctrl-C and SIGTERM raise at once (no training step is in flight outside a fit), so that the
        # command's ``with`` blocks close devices and remove temporaries (Python's SIGTERM would not)
        with _warnings_as_lines(args.command), StopOnSignal():
            return args.func(args)
    except BrokenPipeError:  # e.g. `vmem models | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt as exc:  # the devices are closed by the context managers on the way out
        with StopOnSignal():  # a signal while saying so still ends the command at once
            print(f"vmem {args.command}: {_stopped(exc, args)}", file=sys.stderr, flush=True)
        return 143 if isinstance(exc, Terminated) else 130
    except (ValueError, MemoryError, ImportError, FileNotFoundError, VmemError) as exc:  # user errors: one clear line
        if getattr(args, "json", False):
            print(json.dumps({"command": args.command, "error": str(exc), "type": type(exc).__name__}))
        else:
            print(f"vmem {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
