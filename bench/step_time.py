"""One training step of vgg_cifar at batch 64 on the CPU device, against PyTorch on the CPU in the same run.

vmem runs ``baseline:algos=performance`` (the catalog's fastest convolution algorithms: Winograd F(2x2, 3x3)
on every 3x3 layer but the first, im2col there). PyTorch, when installed,
trains the same network (same layer sizes, NCHW, SGD with momentum). Steps alternate between the two so
that both see the same machine noise, with a pause between them (threads that spin after their work
would slow the other side); the median of each is compared. The machine's own limit is reported too:
the convolutions' achieved FLOP/s (forward, backward-data and backward-filter FLOPs of a direct
convolution over the time the convolution ops took on the compute stream: Winograd's are effective
FLOP/s, as it does 2.25x fewer multiply-adds) as a fraction of NumPy's float32 matmul FLOP/s (4096
square), timed right after each step (this machine's speed drifts).

Then the same again with ``--busy`` competing processes (each a busy Python loop) running on the machine:
both slow down, and the ratio of the two under the same load shows whether vmem shares the cores well
(its core budget, ``vmem.threads.BUDGET``, runs no more threads than the cores the competitors leave free).

vmem first runs its steps alone, for its own step-to-step spread; the matmul timed after each of those
steps gives the machine's own spread over the same stretch, to tell the two apart. Targets: quiet, vmem/PyTorch step time
ratio at most 1.3 and the vmem step's spread over the timed steps it ran alone (max/min) at most 1.15;
with one competing process, the ratio at most 1.5; convolution FLOP/s at least 0.6 of matmul (quiet). The report also gives the ceiling of that fraction: the convolutions' own GEMM
shapes, timed alone on one BLAS thread per lane (thin products, 64 to 512 columns, run well below a
square matmul); Winograd's fewer multiply-adds let the convolutions pass it.

With ``--runs N`` the bench runs itself N times, each a fresh process with the quiet phase only, and
reports the spread from run to run of each run's median step: vmem's, PyTorch's and the matmul's side by
side (the target is vmem's at most 1.15), with the share of CPU time the hypervisor took (steal, from
``/proc/stat``) during each run.

    python bench/step_time.py [--batch 64] [--steps 10] [--busy 1] [--runs 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from contextlib import contextmanager

import numpy as np

from _report import emit, table, verdict

import vmem


#: Seconds between one side's work and the other's: OpenBLAS's threads after a product, and PyTorch's
#: OpenMP threads after a step, spin for a while before they park, and would slow what follows.
PAUSE = 0.2


class Matmul:
    """NumPy's float32 matmul FLOP/s (square, ``n``), timed on demand: the bench times one product next
    to each step, so that the convolutions' fraction of it compares figures measured at the same time
    (this machine's speed drifts by a fifth over a minute)."""

    def __init__(self, n: int = 4096):
        self.n = n
        self.a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
        self.out = np.empty_like(self.a)
        self.seen: list[float] = []
        self()

    def __call__(self) -> float:
        t = _timed(lambda: np.matmul(self.a, self.a, out=self.out))
        self.seen.append(2 * self.n**3 / t / 1e9)
        time.sleep(PAUSE)
        return self.seen[-1]


def gemm_ceiling(conv_ops: dict, matmul: Matmul, rounds: int = 5) -> float:
    """What the convolutions' products alone reach, as a fraction of the matmul figure: each pass's
    GEMM on one im2col chunk of its real shape, timed on one BLAS thread, times the lanes that run side
    by side, weighted by the passes' FLOPs; each round against a matmul timed right after it, the
    median over ``rounds``. The convolutions also gather their columns, so they stay below it."""
    from threadpoolctl import threadpool_limits

    from vmem.device.hostconv.catalog import _im2col_layout
    from vmem.nn.lanes import LANES

    rng = np.random.default_rng(0)
    products = []
    for op in conv_ops.values():
        layer, shape = op.layer, op.in_shapes[0]
        n, c, h, w = shape
        _, k, ho, wo = op.out_shape
        kh, kw = layer.kernel_size
        nb = _im2col_layout(layer, shape, "forward")[0]
        nbd = _im2col_layout(layer, shape, "backward_data")[0]
        shapes = [(nb * ho * wo, kh * kw * c, k, False), (k, nb * ho * wo, kh * kw * c, True)]
        if op.index:
            shapes.append((nbd * h * w, kh * kw * k, c, False))
        for m, kk, nn, transposed in shapes:
            a = rng.standard_normal((kk, m) if transposed else (m, kk)).astype(np.float32)
            products.append(
                (
                    op.flops,
                    2 * m * kk * nn,
                    a.T if transposed else a,
                    rng.standard_normal((kk, nn)).astype(np.float32),
                    np.empty((m, nn), np.float32),
                )
            )
    fractions = []
    for _ in range(rounds):
        seconds = flops = 0.0
        with threadpool_limits(1, user_api="blas"):
            for pass_flops, gemm_flops, a, b, out in products:
                np.matmul(a, b, out=out)
                seconds += pass_flops * _timed(lambda: np.matmul(a, b, out=out)) / gemm_flops
                flops += pass_flops
        fractions.append(flops / (seconds / LANES) / 1e9 / matmul())
    return float(np.median(fractions))


def cpu_ticks() -> tuple[int, int] | None:
    """The machine's cumulative (steal, total) CPU ticks from ``/proc/stat``; None where there is none."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (fields[7] if len(fields) > 7 else 0), sum(fields)


def steal_share(start: tuple[int, int] | None, end: tuple[int, int] | None) -> float | None:
    """The share of CPU time the hypervisor took between two :func:`cpu_ticks` readings."""
    if start is None or end is None or end[1] <= start[1]:
        return None
    return (end[0] - start[0]) / (end[1] - start[1])


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def torch_step_fn(batch: int, x: np.ndarray, y: np.ndarray):
    try:
        import torch
    except ImportError:
        return None, None
    torch.manual_seed(0)
    layers, c = [], 3
    for item in vmem.models.classic.VGG_CONFIGS["cifar"]:
        if item == "M":
            layers.append(torch.nn.MaxPool2d(2))
        else:
            layers += [torch.nn.Conv2d(c, item, 3, padding=1), torch.nn.ReLU(inplace=True)]
            c = item
    model = torch.nn.Sequential(*layers, torch.nn.Flatten(), torch.nn.Linear(2048, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)

    def step() -> float:
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(tx), ty)
        loss.backward()
        opt.step()
        float(loss.detach())
        return time.perf_counter() - t0

    return step, torch.__version__


@contextmanager
def competitors(n: int):
    """``n`` busy processes (a Python loop each) for the duration of the block."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        time.sleep(0.5 if n else 0.0)  # let them start spinning before anything is timed
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def run_steps(trainer, torch_step, x, y, steps: int, conv_ops, matmul: Matmul):
    """``steps`` timed steps of each, alternating, after 2 warm-up steps. Returns vmem's seconds, PyTorch's
    seconds, the convolutions' FLOP/s as a fraction of a matmul timed right after each step, the peak and
    the core budget each vmem step ran under."""
    vmem_times, torch_times, conv_fraction = [], [], []
    budgets = []
    for i in range(steps + 2):
        report = trainer.step(x, y)
        fraction_of = matmul()  # (then a pause)
        t_torch = torch_step() if torch_step else None
        time.sleep(PAUSE)
        if i < 2:
            continue
        vmem_times.append(report.seconds)
        budgets.append(report.threads)
        if t_torch is not None:
            torch_times.append(t_torch)
        flops = seconds = 0.0
        for span in report.spans:
            name = span.name.removesuffix(".backward")
            if name in conv_ops:
                op = conv_ops[name]
                backward = span.name.endswith(".backward")
                flops += op.flops * ((1 if op.index == 0 else 2) if backward else 1)
                seconds += span.end - span.start
        conv_fraction.append(flops / seconds / 1e9 / fraction_of)
    return vmem_times, torch_times, conv_fraction, report.peak_bytes, budgets


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10, help="timed steps of each (after 2 warm-up steps)")
    parser.add_argument(
        "--busy", type=int, default=1, help="competing busy processes in the second phase (0: quiet phase only)"
    )
    parser.add_argument(
        "--runs",
        type=int,
        default=1,
        help="run the quiet phase this many times, each in a fresh process, and report the spread "
        "of the median step from run to run",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.batch < 1 or args.steps < 1 or args.busy < 0 or args.runs < 1:
        parser.error("--batch, --steps and --runs must be at least 1, --busy at least 0")
    if args.runs > 1:
        return run_to_run(args)

    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch, 3, 32, 32)).astype(np.float32)
    y = rng.integers(0, 10, args.batch)
    net = vmem.models.get("vgg_cifar")
    program = net.build(args.batch)
    torch_step, torch_version = torch_step_fn(args.batch, x, y)
    matmul = Matmul()
    conv_ops = {op.name: op for op in program.ops if op.kind == "conv"}
    ceiling = gemm_ceiling(conv_ops, matmul)

    phases = [("quiet", 0)] + ([(f"{args.busy} busy", args.busy)] if args.busy else [])
    result = {
        "bench": "step_time",
        "model": "vgg_cifar",
        "batch": args.batch,
        "steps": args.steps,
        "conv_gemm_ceiling": ceiling,
        "torch_version": torch_version,
        "phases": {},
    }
    rows = []
    with vmem.Trainer(
        net, memory="2GiB", policy="baseline:algos=performance", optimizer=vmem.optim.SGD(lr=0.01, momentum=0.9), seed=0
    ) as trainer:
        # vmem alone first: its own step-to-step spread, without PyTorch's threads between its steps
        mark = len(matmul.seen) + 2  # the matmuls timed after the timed steps (not the warm-up ones)
        ticks = cpu_ticks()
        alone, _, _, _, budgets = run_steps(trainer, None, x, y, args.steps, conv_ops, matmul)
        result["steal_alone"] = steal_share(ticks, cpu_ticks())
        result["vmem_alone_times"] = alone
        result["vmem_alone_budgets"] = budgets
        result["vmem_alone_spread"] = max(alone) / min(alone)
        rows.append(
            (
                "vmem (cpu device), alone",
                float(np.median(alone)),
                f"{min(alone):.3f}-{max(alone):.3f}",
                result["vmem_alone_spread"],
                program.flops * 3 / float(np.median(alone)) / 1e9,
            )
        )
        # the machine's own steadiness over the same stretch: the matmul timed after each of those steps
        mm = [2 * matmul.n**3 / g / 1e9 for g in matmul.seen[mark:]]
        result["matmul_alone_times"] = mm
        result["matmul_alone_spread"] = max(mm) / min(mm)
        rows.append(
            (
                f"NumPy matmul {matmul.n} (after each), alone",
                float(np.median(mm)),
                f"{min(mm):.3f}-{max(mm):.3f}",
                result["matmul_alone_spread"],
                float(np.median(matmul.seen[mark:])),
            )
        )
        for label, busy in phases:
            with competitors(busy):
                ticks = cpu_ticks()
                v_times, t_times, conv_fraction, peak_bytes, budgets = run_steps(
                    trainer, torch_step, x, y, args.steps, conv_ops, matmul
                )
                steal = steal_share(ticks, cpu_ticks())
            v = float(np.median(v_times))
            phase = {
                "competitors": busy,
                "vmem_seconds": v,
                "vmem_times": v_times,
                "steal": steal,
                "vmem_spread": max(v_times) / min(v_times),
                "conv_fraction_of_matmul": float(np.median(conv_fraction)),
                "peak_bytes": peak_bytes,
                "vmem_budgets": budgets,
            }
            rows.append(
                (
                    f"vmem (cpu device), {label}",
                    v,
                    f"{min(v_times):.3f}-{max(v_times):.3f}",
                    phase["vmem_spread"],
                    program.flops * 3 / v / 1e9,
                )
            )
            if t_times:
                t = float(np.median(t_times))
                phase.update(
                    torch_seconds=t, torch_times=t_times, torch_spread=max(t_times) / min(t_times), ratio=v / t
                )
                rows.append(
                    (
                        f"pytorch {torch_version}, {label}",
                        t,
                        f"{min(t_times):.3f}-{max(t_times):.3f}",
                        phase["torch_spread"],
                        program.flops * 3 / t / 1e9,
                    )
                )
            result["phases"][label] = phase

    result["matmul_gflops"] = float(np.median(matmul.seen))
    result["matmul_gflops_range"] = [min(matmul.seen), max(matmul.seen)]
    print(
        f"vgg_cifar batch {args.batch}: one training step (median of {args.steps}, alternating); NumPy float32 "
        f"matmul {result['matmul_gflops']:.0f} GFLOP/s ({min(matmul.seen):.0f}-{max(matmul.seen):.0f} over the run)"
    )
    print(table(["", "median s", "range s", "max/min", "GFLOP/s (step)"], rows))
    seen = [("alone", result["vmem_alone_budgets"])] + [(k, p["vmem_budgets"]) for k, p in result["phases"].items()]
    print(
        "vmem's core budget per timed step: "
        + "; ".join(
            f"{k} " + ", ".join(f"{b} thread{'s' if b != 1 else ''} x{n}" for b, n in sorted(Counter(v).items()))
            for k, v in seen
        )
    )
    quiet = result["phases"]["quiet"]
    targets = [verdict("vmem step spread, quiet, alone (max/min)", result["vmem_alone_spread"], 1.15, at_least=False)]
    print(
        f"the machine's own spread over those steps: {result['matmul_alone_spread']:.3f} (the same NumPy "
        f"matmul timed after each; a spread of vmem's well above it is vmem's, one near it is the machine's)"
    )
    if result["steal_alone"] is not None:
        print(
            f"CPU time taken by the hypervisor (steal): {100 * result['steal_alone']:.1f}% over vmem's alone steps, "
            + ", ".join(f"{100 * p['steal']:.1f}% over the {k} phase" for k, p in result["phases"].items())
        )
    if torch_step:
        targets.append(verdict("vmem/pytorch step time, quiet", quiet["ratio"], 1.3, at_least=False))
        if args.busy == 1:
            targets.append(
                verdict(
                    "vmem/pytorch step time, one busy process", result["phases"]["1 busy"]["ratio"], 1.5, at_least=False
                )
            )
        elif args.busy:
            print(f"vmem/pytorch with {args.busy} busy processes: {result['phases'][phases[1][0]]['ratio']:.3f}")
    else:
        print("PyTorch is not installed (pip install torch==2.13.0): no ratio")
    targets.append(verdict("conv FLOP/s / matmul FLOP/s, quiet", quiet["conv_fraction_of_matmul"], 0.6))
    print(
        f"the convolutions' own GEMMs (one chunk each, one BLAS thread, x{vmem.nn.lanes.LANES} lanes) reach "
        f"{ceiling:.3f} of matmul: the ceiling of an im2col convolution on this BLAS (Winograd's fewer "
        f"multiply-adds can pass it)"
    )
    result["targets"] = targets
    return emit(result, args.json)


def run_to_run(args) -> int:
    """``--runs``: the quiet phase in ``args.runs`` fresh processes; the spread of each side's median step."""
    per_run = []
    for i in range(args.runs):
        cmd = [
            sys.executable,
            __file__,
            "--batch",
            str(args.batch),
            "--steps",
            str(args.steps),
            "--busy",
            "0",
            "--json",
        ]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            sys.stderr.write(done.stderr)
            raise SystemExit(f"step_time run {i + 1} of {args.runs} failed (exit {done.returncode}): {' '.join(cmd)}")
        r = json.loads(done.stdout)
        quiet = r["phases"]["quiet"]
        run = {
            "vmem_alone": float(np.median(r["vmem_alone_times"])),
            "vmem": quiet["vmem_seconds"],
            "pytorch": quiet.get("torch_seconds"),
            "matmul": float(np.median(r["matmul_alone_times"])),
            "ratio": quiet.get("ratio"),
            "vmem_alone_spread": r["vmem_alone_spread"],
            "steal": r.get("steal_alone"),
            "budgets": sorted(set(r["vmem_alone_budgets"])),
        }
        per_run.append(run)
        steal = "" if run["steal"] is None else f", steal {100 * run['steal']:.1f}%"
        steal += f", core budget {'/'.join(map(str, run['budgets']))}"
        print(
            f"run {i + 1}/{args.runs}: vmem alone {run['vmem_alone']:.3f} s, matmul {run['matmul']:.3f} s"
            + (f", vmem/pytorch {run['vmem']:.3f}/{run['pytorch']:.3f} s" if run["pytorch"] else "")
            + steal,
            file=sys.stderr,
            flush=True,
        )
    rows = []
    spreads = {}
    for key, label in (
        ("vmem_alone", "vmem (cpu device), alone"),
        ("vmem", "vmem, quiet (alternating)"),
        ("pytorch", "pytorch, quiet (alternating)"),
        ("matmul", "NumPy matmul 4096 (after each)"),
    ):
        values = [r[key] for r in per_run if r[key] is not None]
        if values:
            spreads[key] = max(values) / min(values)
            rows.append((label, float(np.median(values)), f"{min(values):.3f}-{max(values):.3f}", spreads[key]))
    print(
        f"vgg_cifar batch {args.batch}: the median step of each of {args.runs} runs ({args.steps} steps each, "
        f"quiet, each run a fresh process)"
    )
    print(table(["", "median of runs, s", "range s", "max/min"], rows))
    ratios = [r["ratio"] for r in per_run if r["ratio"] is not None]
    if ratios:
        print(f"vmem/pytorch per run: {min(ratios):.3f}-{max(ratios):.3f} (median {float(np.median(ratios)):.3f})")
    targets = [
        verdict(
            f"vmem step spread over {args.runs} runs, quiet (max/min of the runs' medians)",
            spreads["vmem_alone"],
            1.15,
            at_least=False,
        )
    ]
    print(
        "references over the same runs: " + ", ".join(f"{k} {v:.3f}" for k, v in spreads.items() if k != "vmem_alone")
    )
    result = {
        "bench": "step_time",
        "model": "vgg_cifar",
        "batch": args.batch,
        "steps": args.steps,
        "runs": per_run,
        "spreads": spreads,
        "targets": targets,
    }
    return emit(result, args.json)


if __name__ == "__main__":
    sys.exit(main())
