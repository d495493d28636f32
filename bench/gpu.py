"""GPU benchmarks (issue 12): ratios measured in one run on one GPU, vmem against PyTorch eager.

1. Step time, VGG-16 at batch 64 (224x224), FP32 with TF32 off on both sides: vmem baseline (fastest
   cuDNN algorithms, from a profile) / PyTorch eager (target <= 1.15); vdnn-all / vmem baseline (<= 1.2);
   vdnn-dyn / vmem baseline where baseline fits (<= 1.05).
2. The largest batch that trains VGG-16 in an 8 GiB budget: vmem under each policy (``memory="8GiB"``)
   against PyTorch held to 8 GiB (``set_per_process_memory_fraction``) plain, with
   ``save_on_cpu(pin_memory=True)`` and with ``torch.utils.checkpoint`` (target: vmem's best >= 2x plain).
3. Pinned copies through vmem's device / raw ``cudaMemcpyAsync`` between the same kind of buffers (>= 0.9).
4. The encoding kernels' throughput on the GPU (GB/s of float32 input).

Each section runs on its own: a failure is printed and recorded, and the others still run.

    python bench/gpu.py [--batch 64] [--budget 8GiB] [--steps 5] [--quick] [--sections a,b] [--json-out PATH]
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import sys
import time
import traceback
from pathlib import Path

import numpy as np

_HERE = str(Path(__file__).resolve().parent)
sys.path[:] = [p for p in sys.path if str(Path(p or ".").resolve()) != _HERE] + [_HERE]
from _report import machine, table, verdict  # noqa: E402

import vmem  # noqa: E402
from vmem import format_bytes, parse_bytes  # noqa: E402

GiB = 1 << 30


_T0 = time.perf_counter()


def say(message: str) -> None:
    """Progress, with the seconds since the start (a run cut short still says where it was)."""
    print(f"[{time.perf_counter() - _T0:6.1f} s] {message}", flush=True)


def vmem_step_seconds(policy: str, batch: int, steps: int, memory: str | None = None,
                      profile: bool = True) -> tuple[float, dict]:
    """Median step seconds of vmem on VGG-16 (after two warm-up steps) and what the plan chose. The profile
    runs each layer on its own with its buffers in the arena: in a tight budget at a large batch they may
    not fit (``profile=False`` plans from the device's specification)."""
    net = vmem.models.get("vgg16")
    dev = vmem.device("cuda:0", **({"memory": memory} if memory else {}))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 3, 224, 224)).astype(np.float32)
    y = rng.integers(0, 1000, batch)
    try:
        with vmem.Trainer(net, device=dev, policy=policy, profile=profile, seed=0,
                          optimizer=vmem.optim.SGD(lr=0.01, momentum=0.9)) as trainer:
            t0 = time.perf_counter()
            if profile:
                trainer.profile(batch)
            t1 = time.perf_counter()
            trainer.step(x, y)
            say(f"vmem {policy}, batch {batch}: profile {t1 - t0:.1f} s, plan and first step "
                f"{time.perf_counter() - t1:.1f} s")
            trainer.step(x, y)
            times = [trainer.step(x, y).seconds for _ in range(steps)]
            plan = trainer.plans[batch]
            info = {"chosen": plan.chosen or plan.policy, "peak_bytes": plan.peak_bytes, "step": plan.step,
                    "predicted_seconds": getattr(plan, "step_seconds", None), "times": times}
            say(f"vmem {policy}: steps {', '.join(f'{t * 1e3:.1f}' for t in times)} ms")
    finally:
        dev.close()
    return float(np.median(times)), info


def torch_vgg16(torch):
    nn = torch.nn
    layers, c = [], 3
    for v in (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"):
        if v == "M":
            layers.append(nn.MaxPool2d(2))
        else:
            layers += [nn.Conv2d(c, v, 3, padding=1), nn.ReLU(inplace=True)]
            c = v
    layers += [nn.Flatten(), nn.Linear(25088, 4096), nn.ReLU(inplace=True), nn.Linear(4096, 4096),
               nn.ReLU(inplace=True), nn.Linear(4096, 1000)]
    return nn.Sequential(*layers)


def torch_setup():
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False  # PyTorch allows TF32 in cuDNN by default
    torch.backends.cudnn.benchmark = True  # PyTorch's own algorithm search, as vmem profiles its own
    return torch


def torch_step(torch, model, opt, batch: int, mode: str = "plain") -> float:
    """One step of PyTorch eager, the batch uploaded from pinned host memory inside the timed step (as a
    DataLoader with pin_memory gives it, and as vmem uploads its batch)."""
    x_host = torch.randn(batch, 3, 224, 224).pin_memory()
    y_host = torch.randint(0, 1000, (batch,)).pin_memory()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    x, y = x_host.to("cuda", non_blocking=True), y_host.to("cuda", non_blocking=True)
    opt.zero_grad(set_to_none=True)
    if mode == "save_on_cpu":
        with torch.autograd.graph.save_on_cpu(pin_memory=True):
            loss = torch.nn.functional.cross_entropy(model(x), y)
    elif mode == "checkpoint":
        from torch.utils.checkpoint import checkpoint_sequential

        loss = torch.nn.functional.cross_entropy(checkpoint_sequential(model, 6, x, use_reentrant=False), y)
    else:
        loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def section_step_time(args, out):
    # vmem first, PyTorch after: PyTorch's context and cached memory would otherwise sit beside vmem's arena
    rows, times = [], {}
    for policy in ("baseline:algos=performance", "vdnn-all:algos=performance", "vdnn-dyn"):
        times[policy], info = vmem_step_seconds(policy, args.batch, args.steps, memory=args.memory)
        predicted = info["predicted_seconds"]
        rows.append((policy, f"{times[policy] * 1e3:.1f}", f"{predicted * 1e3:.1f}" if predicted else "-",
                     info["chosen"], format_bytes(info["peak_bytes"])))
        out.setdefault("step_predicted", {})[policy] = predicted
    torch = torch_setup()
    model = torch_vgg16(torch).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for _ in range(2):
        torch_step(torch, model, opt, args.batch)
    torch_times = [torch_step(torch, model, opt, args.batch) for _ in range(args.steps)]
    t_torch = times["pytorch"] = float(np.median(torch_times))
    say(f"pytorch eager: steps {', '.join(f'{t * 1e3:.1f}' for t in torch_times)} ms")
    del model, opt
    torch.cuda.empty_cache()
    rows.append(("pytorch eager", f"{t_torch * 1e3:.1f}", "-", "cudnn.benchmark", "-"))
    print(f"\nVGG-16, batch {args.batch}, 224x224, FP32 (TF32 off): median step of {args.steps}")
    print(table(("run", "step ms", "plan's ms", "algorithms / choice", "plan peak"), rows))
    base = times["baseline:algos=performance"]
    out["step_time"] = times
    out["verdicts"] += [
        verdict("vmem baseline / PyTorch eager", base / t_torch, 1.15, at_least=False),
        verdict("vdnn-all / vmem baseline", times["vdnn-all:algos=performance"] / base, 1.2, at_least=False),
        verdict("vdnn-dyn / vmem baseline (baseline fits)", times["vdnn-dyn"] / base, 1.05, at_least=False)]


def largest(fits, lo: int, hi: int) -> int:
    """The largest batch in [lo, hi) for which ``fits(batch)`` holds (doubling, then bisection)."""
    if not fits(lo):
        return 0
    good, bad = lo, None
    while bad is None and good * 2 < hi:
        if fits(good * 2):
            good *= 2
        else:
            bad = good * 2
    bad = bad or hi
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return good


def section_budget(args, out):
    budget = parse_bytes(args.budget)
    net = vmem.models.get("vgg16")
    dev = vmem.device("cuda:0", memory=args.budget)
    results = {}
    try:
        for policy in ("baseline", "vdnn-conv", "vdnn-all"):
            results[f"vmem {policy}"] = largest(lambda b: vmem.plan(net, b, dev, policy).fits, 1, 4096)
    finally:
        dev.close()
    best = max(results, key=results.get)
    b = results[best]
    say(f"largest batches planned in {args.budget}: {results}")
    try:  # verify: it trains at that batch
        step, _ = vmem_step_seconds(best.split()[1], b, 1, memory=args.budget, profile=False)
        checked = f"verified by a step of {step:.2f} s"
    except Exception as exc:  # noqa: BLE001 - record it; PyTorch's side still runs
        traceback.print_exc()
        checked = f"NOT verified: the step failed ({type(exc).__name__})"
        out["errors"]["budget verification"] = f"{type(exc).__name__}: {exc}"
    torch = torch_setup()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(budget / total)
    for mode in ("plain", "save_on_cpu", "checkpoint"):
        model = torch_vgg16(torch).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def fits(batch, mode=mode, model=model, opt=opt):
            try:
                torch_step(torch, model, opt, batch, mode)
                return True
            except torch.cuda.OutOfMemoryError:
                return False
            finally:
                opt.zero_grad(set_to_none=True)
                torch.cuda.empty_cache()

        results[f"pytorch {mode}"] = largest(fits, 1, 4096)
        say(f"pytorch {mode}: largest batch {results[f'pytorch {mode}']}")
        del model, opt
        torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(1.0)
    print(f"\nlargest VGG-16 batch that trains in {args.budget} (vmem: {best} {checked})")
    print(table(("run", "largest batch"), sorted(results.items())))
    out["budget"] = results
    out["verdicts"].append(verdict("vmem's largest batch / PyTorch plain's", results[best] / max(results["pytorch plain"], 1),
                                   2.0))


def section_copies(args, out):
    import cupy

    from vmem.benchmarks import bandwidth

    n = 256 << 20
    with vmem.device("cuda:0", memory="2GiB", pinned_memory="512MiB") as dev:
        row = bandwidth(dev, [n], rounds=5)[0]
    dst, host = cupy.empty(n, cupy.uint8), cupy.cuda.alloc_pinned_memory(n)
    stream = cupy.cuda.Stream(non_blocking=True)
    raw = {}
    for name, kind, a, b in (("d2h", 2, host.ptr, dst.data.ptr), ("h2d", 1, dst.data.ptr, host.ptr)):
        best = 0.0
        for _ in range(5):
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(stream)
            for _ in range(4):
                cupy.cuda.runtime.memcpyAsync(a, b, n, kind, stream.ptr)
            end.record(stream)
            end.synchronize()
            best = max(best, 4 * n / (cupy.cuda.get_elapsed_time(start, end) / 1e3) / 1e9)
        raw[name] = best
    rows = [(d, f"{row[f'{d}_pinned_gbps']:.1f}", f"{raw[d]:.1f}", f"{row[f'{d}_pinned_gbps'] / raw[d]:.3f}")
            for d in ("d2h", "h2d")]
    print("\npinned copies of 256 MiB: vmem's device against raw cudaMemcpyAsync (GB/s)")
    print(table(("direction", "vmem", "raw", "ratio"), rows))
    out["copies"] = {"vmem": row, "raw": raw}
    out["verdicts"].append(verdict("pinned copies / raw cudaMemcpyAsync (worse direction)",
                                   min(row["d2h_pinned_gbps"] / raw["d2h"], row["h2d_pinned_gbps"] / raw["h2d"]), 0.9))


def section_kernels(args, out):
    import cupy

    n = 64 << 20
    rng = np.random.default_rng(0)
    x = cupy.asarray(np.maximum(rng.standard_normal(n), 0).astype(np.float32))
    rows, res = [], {}
    with vmem.device("cuda:0", memory="1GiB") as dev:
        k = dev.kernels
        cases = {"binarize_encode": (-(-n // 8), (x, cupy.empty(-(-n // 8), cupy.uint8), np.int64(n))),
                 "dpr16_encode": (n, (x.view(cupy.uint32), cupy.empty(n, cupy.uint16), np.int64(n))),
                 "dpr8_encode": (n, (x.view(cupy.uint32), cupy.empty(n, cupy.uint8), np.int64(n))),
                 "zvc_mask": (-(-n // 32), (x.view(cupy.uint32), cupy.empty(-(-n // 32), cupy.uint32),
                                            cupy.empty(-(-n // 32), cupy.uint32), np.int64(n)))}
        for name, (threads, kargs) in cases.items():
            k.launch(name, threads, *kargs)
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record()
            for _ in range(10):
                k.launch(name, threads, *kargs)
            end.record()
            end.synchronize()
            res[name] = 10 * x.nbytes / (cupy.cuda.get_elapsed_time(start, end) / 1e3) / 1e9
            rows.append((name, f"{res[name]:.0f}"))
    print("\nencoding kernels on the GPU, 256 MiB of float32 ReLU output (GB/s of input)")
    print(table(("kernel", "GB/s"), rows))
    out["kernels_gbps"] = res


def section_codecs(args, out):
    """Offload and prefetch through each GPU codec (encode or decode included) against the plain pinned
    copy of the same bytes, at the densities of ReLU outputs."""
    from vmem.benchmarks import codec_bandwidth

    rows, res = [], {}
    with vmem.device("cuda:0", memory="2GiB", pinned_memory="1GiB") as dev:
        for spec in ("zvc", "ssdc", "fp16", "fp8"):
            for row in codec_bandwidth(dev, spec, sizes=("64MiB",), densities=(0.1, 0.5, 0.9), rounds=3):
                res.setdefault(spec, []).append(row)
                rows.append((spec, f"{row['density']:.1f}", f"{row['encoded_bytes'] / row['bytes']:.2f}",
                             f"{row['offload_gbps']:.1f}", f"{row['prefetch_gbps']:.1f}",
                             f"{row['link_d2h_gbps']:.1f}", f"{row['link_h2d_gbps']:.1f}"))
    print("\noffload through a codec on the GPU, 64 MiB of float32 ReLU output (GB/s of the raw tensor)")
    print(table(("codec", "density", "size", "offload", "prefetch", "copy d2h", "copy h2d"), rows))
    out["codecs"] = res


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--budget", default="8GiB")
    parser.add_argument("--memory", default="32GiB",
                        help="vmem's arena for the step times (default 32GiB: VGG-16 at batch 64 fits under baseline, "
                             "and the rest of the GPU is left to CuPy's temporaries, cuDNN and PyTorch)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="skip the batch search (the longest section)")
    parser.add_argument("--json-out", help="write the results as JSON to this file (after each section)")
    parser.add_argument("--sections", help="comma-separated sections to run, of: " + ", ".join(SECTIONS))
    parser.add_argument("--stall-dump", type=float, default=120.0, metavar="SECONDS",
                        help="print every thread's stack when a section has run this long, and again each time "
                             "as long again (default 120; 0: never)")
    args = parser.parse_args()
    from vmem.device.cuda import nvml, unavailable

    reason = unavailable()
    if reason:
        print(f"bench/gpu.py: {reason}", file=sys.stderr)
        return 2
    logging.basicConfig(format="    profile: %(message)s")
    logging.getLogger("vmem.profile").setLevel(logging.INFO)  # a line per layer: where a long profile is
    out: dict = {"verdicts": [], "errors": {}, "machine": machine(), "gpu": nvml.gpus()}
    print(f"GPU: {out['gpu']}")
    names = list(SECTIONS) if not args.sections else [n.strip() for n in args.sections.split(",") if n.strip()]
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        parser.error(f"--sections: unknown {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    if args.quick and not args.sections:
        names.remove("budget")
    for name in names:
        say(f"section {name}")
        if args.stall_dump > 0:  # a stalled run still says where it was
            faulthandler.dump_traceback_later(args.stall_dump, repeat=True)
        try:
            SECTIONS[name](args, out)
        except Exception as exc:  # noqa: BLE001 - record it and go on with the next section
            traceback.print_exc()
            out["errors"][name] = f"{type(exc).__name__}: {exc}"
        faulthandler.cancel_dump_traceback_later()
        if args.json_out:  # after each section: a run cut short keeps what it measured
            Path(args.json_out).write_text(json.dumps(out, indent=2, default=str))
    say("done")
    return 1 if out["errors"] else 0


SECTIONS = {"copies": section_copies, "kernels": section_kernels, "codecs": section_codecs,
            "step_time": section_step_time, "budget": section_budget}


if __name__ == "__main__":
    sys.exit(main())
