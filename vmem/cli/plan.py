"""``vmem plan``: a step planned (or the largest batch searched) without running it; ``--memory auto``'s
budget, which ``vmem train`` shares."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import TYPE_CHECKING, Any, cast

from ..units import format_bytes, printable
from .options import (
    auto_fraction,
    check_memory,
    common,
    math_option,
    model,
    open_device,
    policy_spec,
    positive_int,
)
from ..training.setup import PLANNING_ARENA, auto_memory, budget_line
from .progress import Slow

if TYPE_CHECKING:
    from ..device.cuda.device import CudaDevice
    from ..device.base import Device
    from ..graph.network import Network

__all__ = ["cmd_plan", "add_parser"]


def cmd_plan(args: argparse.Namespace) -> int:
    from ..planning import plan, profiles

    net = model(args)
    check_memory(args)
    if args.largest_batch:
        return _largest_batch(args, net)
    if args.jobs is not None and not args.curve:
        raise ValueError("--jobs plans a curve's budgets side by side: add --curve")
    if args.measure is not None and not args.curve:
        raise ValueError("--measure measures the points of a curve: add --curve")
    if args.curve:
        return _curve(args, net)
    if args.batch is None:
        raise ValueError("--batch is required (or --largest-batch: the largest batch that fits)")
    simulated = args.device.startswith("sim:")
    if args.policy is None and args.memory is not None and not simulated and not args.profile:
        args.policy = "baseline"  # auto would profile the device first: only when asked (--profile)
    fraction = auto_fraction(args.memory, "") if args.memory is not None else None
    memory: Any = args.memory
    needs = None
    raised = False
    # a CUDA device planned on without a profile is opened once, with a tiny arena, for the budget and the plan
    planning = (
        open_device(args.device, PLANNING_ARENA, **math_option(args))
        if args.device.startswith("cuda") and not args.profile
        else None
    )
    if fraction is not None:
        memory, needs, raised = auto_memory(args, net, fraction, policy_spec(args), planning)
    costs, notes = None, []
    policy = policy_spec(args)
    say = (lambda text: None) if args.json else (lambda text: print(text, file=sys.stderr, flush=True))
    if needs is not None and fraction is not None:
        say(budget_line(memory, needs, fraction, raised, policy, args.batch))
    if not simulated and not args.profile and profiles.needs_profile(policy):
        say(f"{policy} decides by measured time: profiling first (as --profile does)")
        if planning is not None:
            planning.close()
            planning = None
        args.profile = True
    if simulated:
        device: Device = args.device if args.math is None else open_device(args.device, **math_option(args))
        if args.profile:
            say(f"--profile: {args.device} is simulated; its times come from the roofline model")
    elif args.profile:  # measure on the device itself, within the budget the plan is for
        device = open_device(args.device, memory, **math_option(args))
        memory = device.pool.capacity
        say(
            f"profiling {len(net.build(args.batch, precision=args.precision).ops)} layers of {net.name} at batch {args.batch} on {device.name} (every pass "
            f"and algorithm, in its {format_bytes(device.pool.capacity)})..."
        )
        t0 = time.perf_counter()
        costs, kept = profiles.measure(net, args.batch, device, precision=args.precision)
        notes = costs.notes
        say(
            (
                f"the profile kept in {printable(str(profiles.cache_folder()))} (VMEM_PROFILE_CACHE=0 measures afresh)"
                if kept
                else f"profiled in {time.perf_counter() - t0:.1f} s"
            )
            + "".join(f"\n  {n}" for n in notes)
        )
    elif planning is not None:  # its algorithms and spec, without taking its memory
        device = planning
        memory = memory if memory is not None else cast("CudaDevice", device).free_capacity
    else:
        device = args.device
    try:
        with Slow(f"planning {net.name} at batch {args.batch} under {policy} on {args.device}", quiet=args.json):
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
                oversubscribe=bool(getattr(args, "oversubscribe", False)),
            )
    finally:
        if not isinstance(device, str):
            device.close()
    out = result.to_dict()
    out.update(model=net.name, memory=memory, baseline_peak_bytes=needs, profile_notes=notes)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        _print_plan(args, result)
    return 0 if result.fits else 1  # a plan that does not fit is a failure, as vdnn-dyn's refusal is


def _print_plan(args: argparse.Namespace, result: Any) -> None:
    """``vmem plan``'s text: the plan's table, whether it fits, its predicted times, its communication and
    its reason."""
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


def _curve(args: argparse.Namespace, net: Network) -> int:
    """``vmem plan --curve``: auto's plan at budgets from its floor to keep-all, the named policies beside
    (:func:`vmem.curve`), as a table or ``--json``; ``--plot PATH`` draws it."""
    import sys

    from ..planning import curve, profiles

    if args.batch is None:
        raise ValueError("--curve needs --batch: the curve is of one batch")
    if args.memory is not None:
        raise ValueError("--curve plans every budget itself (from the least auto trains in to keep-all): drop --memory")
    if args.measure is not None:
        if args.device.startswith("sim:"):
            raise ValueError(f"--measure trains each point's plan: use a real device (cpu, cuda:N), not {args.device}")
        from ..training.curve import measured_curve

        tty = sys.stderr.isatty()

        def say(text: str) -> None:  # on a terminal, one line rewritten; else each stage on its own line
            if args.json:
                return
            if tty:
                print(f"\r{text}\033[K", end="", file=sys.stderr, flush=True)
            elif not text.startswith("planned"):
                print(text, file=sys.stderr, flush=True)

        made = measured_curve(net, args.batch, args.device, precision=args.precision, steps=args.measure, progress=say)
        if tty and not args.json:
            print(file=sys.stderr)
        if args.plot:
            made.plot(args.plot)
        print(made.json() if args.json else made.table())
        return 0
    costs, device = None, args.device
    if not args.device.startswith("sim:"):
        if not args.profile:
            raise ValueError(f"--curve on {args.device} predicts times from a profile: add --profile (or use sim:GPU)")
        device = open_device(args.device, **math_option(args))
        costs, _ = profiles.measure(net, args.batch, device, precision=args.precision)

    def progress(done: int, total: int) -> None:
        if not args.json:
            print(f"\rplanned {done} of {total} budgets", end="", file=sys.stderr, flush=True)

    jobs = args.jobs or min(4, os.cpu_count() or 1)
    result = curve(net, args.batch, device, precision=args.precision, costs=costs, progress=progress, workers=jobs)
    if not args.json:
        print(file=sys.stderr)
    if args.plot:
        result.plot(args.plot)
    print(result.json() if args.json else result.table())
    return 0


#: The batch ``--largest-batch`` profiles at (its op times then scaled to each batch it tries)
_PROFILED_BATCH = 32


def _largest_batch(args: argparse.Namespace, net: Network) -> int:
    """``vmem plan --largest-batch``: the largest batch ``--policy`` (auto by default) plans to fit."""
    from ..planning import largest_batch, profiles

    if args.memory is not None and str(args.memory).startswith("auto"):
        raise ValueError("--largest-batch takes --memory as a size (e.g. 8GiB), not auto")
    policy = args.policy or "auto"
    if args.algos:
        policy = policy_spec(args)
    device: Device = args.device
    simulated = args.device.startswith("sim:")
    # a policy that ranks plans by measured time plans each batch tried with a profile of the device at it
    measured = not simulated and (args.profile or profiles.needs_profile(policy))
    if measured:  # profiled within the budget the plans are for
        device = open_device(args.device, args.memory, **math_option(args))
    elif args.device.startswith("cuda"):  # its catalog and spec, without taking its memory
        device = open_device(args.device, PLANNING_ARENA, **math_option(args))
    tries: list[tuple[int, bool]] = []
    say = (lambda text: None) if args.json else (lambda text: print(text, file=sys.stderr, flush=True))

    profiled: list[Any] = []  # one profile, made on the first try

    def costs(batch: int) -> Any:
        # one profile, at a small batch, its op times scaled to each batch tried: whether a plan fits does
        # not hang on its predicted time (profiling every batch tried took minutes)
        at = _PROFILED_BATCH
        if not profiled:
            say(f"profiling {net.name} at batch {at} on {args.device} (op times scaled to each batch tried)...")
            profiled.append(profiles.measure(net, at, cast("Device", device), precision=args.precision)[0])
        return profiled[0] if batch == at else profiled[0].scaled(batch / at)

    def progress(batch: int, ok: bool) -> None:
        tries.append((batch, ok))
        say(f"  batch {batch}: {'fits' if ok else 'does not fit'}")

    if measured:
        say(f"{policy} decides by measured time: the device is profiled first (as --profile does)")
    try:
        with Slow(f"searching the largest batch of {net.name} under {policy} on {args.device}", quiet=args.json):
            found = largest_batch(
                net,
                device,
                memory=args.memory,
                policy=policy,
                precision=args.precision,
                most=args.batch or 1 << 16,
                progress=progress,
                costs=costs if measured else None,
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


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "plan",
        help="plan a training step without running it",
        description="Replay one step's allocations under a policy and print the plan. Exits 1 if "
        "the plan does not fit the device's memory.",
    )
    common(
        p,
        None,
        memory_help="device memory, e.g. 256MiB or 12GB, or auto[:FRACTION]: that fraction of what "
        "the baseline policy needs on this device (default: the device's capacity; the CPU's 1GiB)",
        simulated=True,
        policy_help="auto where --memory is given on a simulated GPU or with --profile, else baseline",
    )
    p.add_argument(
        "--batch",
        type=positive_int,
        help="the batch of one rank (with --nproc); required, except with --largest-batch (then the most tried)",
    )
    p.add_argument(
        "--largest-batch",
        action="store_true",
        help="print the largest batch the policy plans to fit in --memory (plans only: nothing runs)",
    )
    p.add_argument(
        "--curve",
        action="store_true",
        help="the memory/time curve: auto's plan at 20 or more budgets from the least it trains in to keeping "
        "everything, each with its predicted step time and what it does, the named policies beside",
    )
    p.add_argument("--plot", metavar="PATH", help="with --curve: draw the curve into an image (the plot extra)")
    p.add_argument(
        "--jobs",
        type=positive_int,
        default=None,
        metavar="N",
        help="with --curve: plan the budgets in N processes (default: one per core, at most 4; the same curve)",
    )
    p.add_argument(
        "--measure",
        type=positive_int,
        nargs="?",
        const=5,
        metavar="STEPS",
        help="with --curve on a real device (cpu, cuda:N): train each point's plan for STEPS steps (default 5) "
        "and print its measured peak and median step beside the predicted",
    )
    p.add_argument(
        "--nproc",
        type=positive_int,
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
