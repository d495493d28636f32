"""Probe one convolution of a network on the GPU: cuDNN's heuristic ranking of each pass, then every
algorithm run once on its own, timed and printed as it finishes (so a run cut short still says which
algorithm it was in), then cuDNN's own search (``Find*Ex``) per pass. With ``--profile``, instead, the
whole profile vmem makes for planning (:func:`vmem.costs.profile`), a line per layer, in an arena of
``--memory`` (``all``: the device's default, the free memory less the reserve), after PyTorch has run a
convolution in the same process if ``--with-torch``.

    python bench/gpu_conv_probe.py [--model vgg16] [--batch 64] [--layer conv2] [--skip-find]
    python bench/gpu_conv_probe.py --profile [--memory all] [--with-torch]
    python bench/gpu_conv_probe.py --layouts [--model vgg16] [--batch 64]

``--layouts``: every convolution of the model searched by cuDNN's legacy API (``Find*Ex``, as PyTorch's
``cudnn.benchmark`` does) with its tensors stored channels last (vmem's layout) and NCHW (PyTorch's
default), and through cuDNN's graph API (:mod:`vmem.device.cuda.graph`: its heuristics' best exact-FP32
engines, each timed) channels last; FP32 without TF32 throughout: the fastest of each pass, all and
deterministic only, and the sums. What the layout and the legacy API cost vmem against PyTorch.

For finding what makes a profile slow. Every thread's stack is printed if it runs past ``--stall-dump``.
"""

from __future__ import annotations

import sys


import argparse
import faulthandler
import logging
import time
from types import SimpleNamespace

import numpy as np

import vmem
from vmem.nn.base import physical


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="vgg16")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--layer", default="conv2", help="the convolution's op name (default conv2)")
    parser.add_argument(
        "--memory", default="40GiB", help="the device arena (default 40GiB; with --profile, all: the device's default)"
    )
    parser.add_argument("--skip-find", action="store_true", help="do not run cuDNN's search at the end")
    parser.add_argument("--profile", action="store_true", help="run vmem's whole profile of the model instead")
    parser.add_argument("--with-torch", action="store_true", help="with --profile: run PyTorch first, in-process")
    parser.add_argument(
        "--layouts", action="store_true", help="search every convolution in NHWC and NCHW instead (see above)"
    )
    parser.add_argument(
        "--stall-dump",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="print every thread's stack after this long, and again each time as long again",
    )
    args = parser.parse_args()
    faulthandler.dump_traceback_later(args.stall_dump, repeat=True)
    from vmem.device.cuda import unavailable

    if unavailable():
        print(f"gpu_conv_probe: {unavailable()}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()

    def say(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:7.2f} s] {msg}", flush=True)

    net = vmem.models.get(args.model)
    if args.profile:
        return _profile(args, net, say)
    if args.layouts:
        return _layouts(args, net, say)
    with vmem.device("cuda:0", memory=args.memory) as dev:
        program = dev.catalog(net.build(args.batch, net.input_shape, "float32"))
        convs = {op.name: op for op in program.ops if op.kind == "conv"}
        if args.layer not in convs:
            parser.error(
                f"--layer: {args.layer!r} is not a convolution of {args.model}; choose from {', '.join(convs)}"
            )
        op = convs[args.layer]
        conv, cp, s = dev.conv_backend, dev.xp, dev.compute_stream
        x_shape, y_shape = physical(op.in_shapes[0]), physical(op.out_shape)
        say(
            f"{args.model} {op.name} batch {args.batch}: x {x_shape} -> y {y_shape}; workspace (MiB) "
            + "; ".join(
                f"{p}: " + ", ".join(f"{a} {b / 2**20:.0f}" for a, b in op.workspace[p].items()) for p in op.workspace
            )
        )
        gen = cp.random.default_rng(0)
        x, dx = gen.standard_normal(x_shape, dtype=np.float32), cp.empty(x_shape, np.float32)
        y, dy = cp.empty(y_shape, np.float32), gen.standard_normal(y_shape, dtype=np.float32)
        w = gen.standard_normal(op.params["weight"].shape, dtype=np.float32)
        dw = cp.empty_like(w)
        room = 16 << 30
        ws_bytes = max([b for p in op.workspace.values() for b in p.values() if b <= room] + [1])
        ws = cp.empty(ws_bytes, np.uint8)
        say(f"buffers ready; workspace buffer {ws_bytes / 2**20:.0f} MiB (algorithms needing more are skipped)")
        for pass_ in ("forward", "backward_filter", "backward_data"):
            box: dict = {}
            s.launch(lambda p=pass_: box.__setitem__("r", conv.heuristic(op.layer, p, x_shape, y_shape)))
            say(f"heuristic {pass_}: {box['r']}")
        layer = op.layer
        for pass_ in ("forward", "backward_filter", "backward_data"):
            for algo in op.algorithms[pass_]:
                if op.workspace[pass_][algo] > room:
                    say(f"{pass_} {algo}: skipped (workspace)")
                    continue
                ctx = SimpleNamespace(
                    algo=algo
                    if pass_ == "forward"
                    else (algo, "algo_1")
                    if pass_ == "backward_data"
                    else ("algo_1", algo),
                    workspace=ws,
                )
                for run in ("first", "second"):
                    a = time.perf_counter()
                    try:
                        if pass_ == "forward":
                            s.launch(conv.forward, layer, ctx, x, w, y)
                        elif pass_ == "backward_filter":
                            s.launch(conv.backward, layer, ctx, dy, x, w, None, dw)
                        else:
                            s.launch(conv.backward, layer, ctx, dy, x, w, dx, dw)
                        s.synchronize()
                        say(f"{pass_} {algo} ({run} run): {(time.perf_counter() - a) * 1e3:.1f} ms")
                    except Exception as exc:  # noqa: BLE001 - an unsupported algorithm: say so, go on
                        say(f"{pass_} {algo}: {type(exc).__name__}: {exc}")
                        break
        if not args.skip_find:
            for pass_, bufs in (
                ("forward", (x, w, y)),
                ("backward_filter", (x, dw, dy)),
                ("backward_data", (dx, w, dy)),
            ):
                box = {}
                a = time.perf_counter()
                s.launch(lambda p=pass_, b=bufs: box.__setitem__("r", conv.find(layer, p, *b, ws)))
                s.synchronize()
                say(
                    f"find {pass_} ({(time.perf_counter() - a):.1f} s): "
                    + ", ".join(f"{n} {t * 1e3:.1f} ms" for n, t, _ in box["r"])
                )
    return 0


def _profile(args, net, say) -> int:
    from vmem.costs import profile

    if args.with_torch:
        import torch

        conv = torch.nn.Conv2d(64, 64, 3, padding=1).cuda()
        conv(torch.randn(64, 64, 224, 224, device="cuda")).sum().backward()
        torch.cuda.synchronize()
        say(f"PyTorch ran a convolution; it holds {torch.cuda.memory_reserved() / 2**30:.2f} GiB")
    logging.basicConfig(format="    profile: %(message)s")
    logging.getLogger("vmem.profile").setLevel(logging.INFO)
    memory = None if args.memory == "all" else args.memory
    with vmem.device("cuda:0", **({"memory": memory} if memory else {})) as dev:
        import cupy

        free, total = cupy.cuda.runtime.memGetInfo()
        say(f"{dev!r}; {free / 2**30:.2f} GiB of {total / 2**30:.2f} GiB free outside the arena")
        program = dev.catalog(net.build(args.batch, net.input_shape, "float32"))
        say(f"catalog of {len(program.ops)} ops")
        prof = profile(program, device=dev)
        say(f"profile done: {len(prof.times)} times, link {prof.d2h:.1f} GB/s")
    return 0


def _graph_timed(handle, geometry, pass_: str, bufs, ws, top: int) -> list[tuple[str, bool, float]]:
    """The graph API's best ``top`` exact-FP32 configurations for one pass (cuDNN's heuristics, mode A),
    each built into a plan and timed by events (after a warm-up run): (name, deterministic, seconds),
    fastest first. Configurations that compile at run time, need more workspace than ``ws`` or fail are
    left out."""
    from vmem.device.cuda import cudnn
    from vmem.device.cuda.graph import ConvPass, ExecutionPlan

    out = []
    conv = ConvPass(pass_, geometry)
    for cfg in conv.heuristics(handle.ptr)[:top]:
        if "runtime_compilation" in cfg.behavior:
            continue
        try:
            plan = ExecutionPlan(handle.ptr, cfg, conv)
            if plan.workspace > ws.nbytes:
                continue
            out.append((cfg.name, cfg.deterministic, plan.seconds(*(b.data.ptr for b in bufs), ws.data.ptr)))
        except cudnn.CudnnError:
            continue
    return sorted(out, key=lambda r: r[2])


def _layouts(args, net, say) -> int:
    import cupy

    from vmem.device.cuda import cudnn
    from vmem.device.cuda.conv import Descs, _geometry
    from vmem.device.cuda.conv_search import search

    program = net.build(args.batch, net.input_shape, "float32")
    convs = [op for op in program.ops if op.kind == "conv"]
    stream = cupy.cuda.Stream(non_blocking=True)
    handle = cudnn.Handle(stream.ptr)
    gen = cupy.random.default_rng(0)
    ws = cupy.empty(4 << 30, np.uint8)  # algorithms that need more are left out
    ways = ("NHWC", "NCHW", "NHWC graph")
    sums = {(way, which): 0.0 for way in ways for which in ("all", "deterministic")}
    missing = dict.fromkeys(sums, 0)  # passes for which a way ran nothing
    say(
        f"{args.model} batch {args.batch}: {len(convs)} convolutions, cuDNN {cudnn.version()}, 4 GiB workspace; "
        "legacy Find*Ex in NHWC and NCHW, and the graph API's heuristics (top 6 exact FP32 engines) in NHWC"
    )
    seen: dict[tuple, tuple[str, dict, dict]] = {}  # geometry -> (first op, its sums, its misses): VGG-16 repeats
    with stream:
        for op in convs:
            x_shape, y_shape = physical(op.in_shapes[0]), physical(op.out_shape)
            geometry = _geometry(op.layer, x_shape, y_shape)
            if geometry in seen:
                first, added, lacking = seen[geometry]
                for key in sums:
                    sums[key] += added[key]
                    missing[key] += lacking[key]
                say(f"{op.name}: as {first}")
                continue
            before, missed = dict(sums), dict(missing)
            x, dy = gen.standard_normal(x_shape, dtype=np.float32), gen.standard_normal(y_shape, dtype=np.float32)
            w = gen.standard_normal(op.params["weight"].shape, dtype=np.float32)
            y, dx, dw = cupy.empty_like(dy), cupy.empty_like(x), cupy.empty_like(w)
            passes = (("forward", (x, w, y)), ("backward_filter", (x, dw, dy)), ("backward_data", (dx, w, dy)))
            for way in ways:  # the same bytes, read in either layout
                parts = []
                for pass_, bufs in passes:
                    try:
                        if way == "NHWC graph":
                            timed = _graph_timed(handle, geometry, pass_, bufs, ws, top=6)
                            found = [(name, t) for name, _, t in timed]
                            exact = [(name, t) for name, det, t in timed if det]
                        else:
                            d = Descs(geometry, cudnn.NHWC if way == "NHWC" else cudnn.NCHW)
                            found = [(name, t) for name, t, _ in search(handle.ptr, pass_, d, *bufs, ws)]
                            det = [name for name, _, _ in search(handle.ptr, pass_, d, *bufs, ws, True)]
                            exact = [r for r in found if r[0] in det]  # by each result's determinism
                    except Exception as exc:  # noqa: BLE001 - say what failed and go on
                        parts.append(f"{pass_} failed ({type(exc).__name__}: {exc})")
                        found = exact = []
                    else:
                        part = f"{pass_} " + (f"{exact[0][0]} {exact[0][1] * 1e3:.2f} ms" if exact else "none")
                        if found and (not exact or found[0][0] != exact[0][0]):  # faster with atomics
                            part += f" (any: {found[0][0]} {found[0][1] * 1e3:.2f} ms)"
                        parts.append(part)
                    for which, rows in (("all", found), ("deterministic", exact)):
                        if rows:
                            sums[(way, which)] += rows[0][1]
                        else:  # nothing ran for this pass this way: counted apart, not as zero
                            missing[(way, which)] += 1
                say(f"{op.name} {way}: " + "; ".join(parts))
            seen[geometry] = (
                op.name,
                {key: sums[key] - before[key] for key in sums},
                {key: missing[key] - missed[key] for key in sums},
            )
            del x, dy, w, y, dx, dw
            cupy.get_default_memory_pool().free_all_blocks()
    handle.close()
    for which in ("deterministic", "all"):
        say(
            f"sum of the fastest {which} (forward + backward, ms): "
            + ", ".join(
                f"{way} {sums[(way, which)] * 1e3:.1f}"
                + (f" ({missing[(way, which)]} passes with none)" if missing[(way, which)] else "")
                for way in ways
            )
            + f"; NHWC / NCHW {sums[('NHWC', which)] / sums[('NCHW', which)]:.3f}, "
            f"NHWC graph / NCHW {sums[('NHWC graph', which)] / sums[('NCHW', which)]:.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
