"""One training step of vgg_cifar at batch 64 on the CPU device, against PyTorch on the CPU in the same run.

vmem runs ``baseline:algos=performance`` (the fastest convolution algorithms). PyTorch, when installed,
trains the same network (same layer sizes, NCHW, SGD with momentum). Steps alternate between the two so
that both see the same machine noise; the median of each is compared. The machine's own limit is
reported too: the convolutions' achieved FLOP/s (forward, backward-data and backward-filter FLOPs over
the time the convolution ops took on the compute stream) as a fraction of NumPy's float32 matmul FLOP/s
measured in the same run.

Targets (issue 3): vmem/PyTorch step time ratio at most 1.3; convolution FLOP/s at least 0.6 of matmul.

    python bench/step_time.py [--batch 64] [--steps 10] [--json]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

_HERE = str(Path(__file__).resolve().parent)
sys.path[:] = [p for p in sys.path if str(Path(p or ".").resolve()) != _HERE] + [_HERE]
from _report import emit, table, verdict  # noqa: E402

import vmem  # noqa: E402


def matmul_gflops(n: int = 4096, rounds: int = 3) -> float:
    a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    b = a.copy()
    out = np.empty_like(a)
    np.matmul(a, b, out=out)
    best = min(_timed(lambda: np.matmul(a, b, out=out)) for _ in range(rounds))
    return 2 * n**3 / best / 1e9


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10, help="timed steps of each (after 2 warm-up steps)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch, 3, 32, 32)).astype(np.float32)
    y = rng.integers(0, 10, args.batch)
    net = vmem.models.get("vgg_cifar")
    program = net.build(args.batch)
    torch_step, torch_version = torch_step_fn(args.batch, x, y)
    peak = matmul_gflops()

    vmem_times, torch_times, conv_fraction = [], [], []
    conv_ops = {op.name: op for op in program.ops if op.kind == "conv"}
    with vmem.Trainer(net, memory="2GiB", policy="baseline:algos=performance",
                      optimizer=vmem.optim.SGD(lr=0.01, momentum=0.9), seed=0) as trainer:
        for i in range(args.steps + 2):
            report = trainer.step(x, y)
            t_torch = torch_step() if torch_step else None
            if i < 2:
                continue
            vmem_times.append(report.seconds)
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
            conv_fraction.append(flops / seconds / 1e9 / peak)
        peak_bytes = report.peak_bytes

    v = float(np.median(vmem_times))
    rows = [("vmem (cpu device)", v, program.flops * 3 / v / 1e9)]
    result = {"bench": "step_time", "model": "vgg_cifar", "batch": args.batch, "vmem_seconds": v,
              "matmul_gflops": peak, "conv_fraction_of_matmul": float(np.median(conv_fraction)),
              "peak_bytes": peak_bytes, "torch_version": torch_version}
    targets = []
    if torch_times:
        t = float(np.median(torch_times))
        rows.append((f"pytorch {torch_version}", t, program.flops * 3 / t / 1e9))
        result["torch_seconds"] = t
        result["ratio"] = v / t
    print(f"vgg_cifar batch {args.batch}: one training step (median of {args.steps}); "
          f"NumPy float32 matmul {peak:.0f} GFLOP/s")
    print(table(["", "seconds", "GFLOP/s (step)"], rows))
    if torch_times:
        targets.append(verdict("vmem/pytorch step time", result["ratio"], 1.3, at_least=False))
    else:
        print("PyTorch is not installed (pip install torch==2.13.0): no ratio")
    targets.append(verdict("conv FLOP/s / matmul FLOP/s", result["conv_fraction_of_matmul"], 0.6))
    result["targets"] = targets
    return emit(result, args.json)


if __name__ == "__main__":
    sys.exit(main())
